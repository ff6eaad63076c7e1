"""Stage helpers: resume folders change with the config and the start model, metrics files are atomic."""

import json

from vlmgym.config.spec import with_values
from vlmgym.params import EnvParams, ModelParams, TrainParams
from vlmgym.rl.stage_setup import folder_identity, resume_dir, write_json_atomically


def test_resume_dir_depends_on_every_setting_and_the_start_model(tmp_path):
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    train, model, env = TrainParams(), ModelParams(), EnvParams()
    first = resume_dir(tmp_path / "ckpt", train, model, env, init_dir=init)
    assert first == resume_dir(tmp_path / "ckpt", train, model, env, init_dir=init)
    assert first.parent == tmp_path / "ckpt"
    assert first != resume_dir(tmp_path / "ckpt", with_values(train, {"optimizer.lr": 2e-4}), model, env, init_dir=init)
    before = folder_identity(init)
    (init / "config.json").write_text('{"hidden": 1}')
    assert folder_identity(init) != before
    assert first != resume_dir(tmp_path / "ckpt", train, model, env, init_dir=init)


def test_write_json_atomically(tmp_path):
    path = tmp_path / "metrics" / "train.json"
    write_json_atomically(path, {"reward_mean": 0.5})
    assert json.loads(path.read_text()) == {"reward_mean": 0.5}
    assert [p.name for p in path.parent.iterdir()] == ["train.json"]


def test_resume_dir_changes_with_the_source_code(tmp_path, monkeypatch):
    from vlmgym.rl import stage_setup as run

    init = tmp_path / "init"
    init.mkdir()
    args = (tmp_path / "ckpt", TrainParams(), ModelParams(), EnvParams())
    first = resume_dir(*args, init_dir=init)
    monkeypatch.setattr(run, "source_identity", lambda: "edited-code")
    assert first != resume_dir(*args, init_dir=init)


def test_history_summary_means_the_last_steps():
    from vlmgym.rl.stage_setup import history_summary

    history = [{"reward_mean": float(i), "entropy": 1.0} for i in range(10)]
    assert history_summary(history, ("reward_mean", "entropy", "absent"), 4) == {"reward_mean": 7.5, "entropy": 1.0}
    assert history_summary([], ("reward_mean",), 4) == {}
