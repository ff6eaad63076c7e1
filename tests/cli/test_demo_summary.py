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
    # `dvc metrics show` is pointed at the headline, which fits a terminal, not at every figure of eval.json
    assert "dvc metrics show   (the headline, metrics/headline.json; every figure with its interval: " \
           "reports/eval.md, metrics/eval.json)" in out
    assert "Unsent" not in out
    (tmp_path / "mlflow-spool" / "run1").mkdir(parents=True)
    demo_summary.main()
    assert "Unsent MLflow logs of 1 run(s) in mlflow-spool/: `vlmgym tracking sync`" in capsys.readouterr().out


def test_the_summary_sets_greedy_beside_sampled_mean_and_best_of_k(tmp_path, monkeypatch, capsys):
    import json

    (tmp_path / "metrics").mkdir()
    metrics = {"sft": {"mean_reward": 0.3, "sampled_mean_reward": 0.2, "best_of_k_reward": 0.45},
               "grpo": {"mean_reward": 0.36, "sampled_mean_reward": 0.25, "best_of_k_reward": 0.44}}
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps(metrics))
    monkeypatch.setattr(demo_summary, "repo_root", lambda: tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    demo_summary.main()
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.split() == ["greedy", "0.300", "0.360"] for line in lines)
    assert any(line.split() == ["k", "sampled,", "mean", "0.200", "0.250"] for line in lines)
    assert any(line.split() == ["k", "sampled,", "best", "0.450", "0.440"] for line in lines)
    assert "vlmgym study new rl-vs-sft --arms sft_longer grpo, then dvc repro" in out
