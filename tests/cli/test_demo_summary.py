"""What `make demo` prints last: the results, and where to find the runs, the report and the best export."""

from vlmgym.cli import demo_summary


def test_the_summary_names_the_champion_and_unsent_logs(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("env:\n  name: nlvr2\n")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text('{"grpo/mean_reward": 0.5}\n')
    monkeypatch.setattr(demo_summary, "repo_root", lambda: tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert demo_summary.main() == 0
    out = capsys.readouterr().out
    assert '"grpo/mean_reward": 0.5' in out and 'models:/vlmgym-nlvr2@champion' in out
    assert "Unsent" not in out
    (tmp_path / "mlflow-spool" / "run1").mkdir(parents=True)
    demo_summary.main()
    assert "Unsent MLflow logs of 1 run(s) in mlflow-spool/: `vlmgym tracking sync`" in capsys.readouterr().out
