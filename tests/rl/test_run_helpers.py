"""Stage helpers: resume folders change with the config, the start model's bytes, the shards' content and the env's
own sources; metrics files are atomic."""

import hashlib
import json
from pathlib import Path

import pytest

from vlmgym.envs.registry import scoped_registrations
from vlmgym.params import EnvParams, ModelParams, SFTParams, TrainParams, with_values
from vlmgym.rl.stage_setup import env_sources, folder_identity, resume_dir, write_json_atomically

COLOUR_ENV = Path(__file__).resolve().parents[1] / "envs" / "colour_env.py"  # docs/writing-an-env.md's plug-in


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


def test_resume_dir_changes_with_the_start_models_weights_at_the_same_size(tmp_path):
    init = tmp_path / "init"
    (init / "params").mkdir(parents=True)
    weights = init / "params" / "weights"
    weights.write_bytes(bytes(2 << 20))  # past the size under which the cheap folder hash reads a file at all
    args = (tmp_path / "ckpt", TrainParams(), ModelParams(), EnvParams())
    first = resume_dir(*args, init_dir=init)
    weights.write_bytes(b"\1" + bytes((2 << 20) - 1))
    assert resume_dir(*args, init_dir=init) != first


def shards_with_manifest(root, splits):
    """A shards folder whose manifest records each tar's sha256, as the shard stage writes it."""
    manifest = {"splits": {}}
    for split, data in splits.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / "shard-000000.tar").write_bytes(data)
        manifest["splits"][split] = {"shards": [{"name": "shard-000000.tar",
                                                 "sha256": hashlib.sha256(data).hexdigest()}]}
    (root / "manifest.json").write_text(json.dumps(manifest))


# sft reads train and val; train samples the rl split where the shard stage held one out, and validates on val
@pytest.mark.parametrize(("section", "read", "unread"), [(SFTParams, ("train", "val"), "rl"),
                                                         (TrainParams, ("rl", "val"), "test")])
def test_resume_dir_changes_with_the_shards_the_stage_reads(tmp_path, section, read, unread):
    init, shards = tmp_path / "init", tmp_path / "shards"
    init.mkdir()
    splits = {"train": b"train", "val": b"val", "rl": b"rl", "test": b"test"}
    shards_with_manifest(shards, splits)
    config = with_values(section(), {"shards_dir": str(shards)})
    args = (tmp_path / "ckpt", config, ModelParams(), EnvParams())
    first = resume_dir(*args, init_dir=init)
    shards_with_manifest(shards, {**splits, unread: b"other data"})  # a split this stage never reads
    assert resume_dir(*args, init_dir=init) == first
    for split in read:
        shards_with_manifest(shards, {**splits, split: b"another seed's data"})
        assert resume_dir(*args, init_dir=init) != first


@pytest.fixture
def plug_in(tmp_path, monkeypatch):
    """The colour env as a user's own module beside params.yaml, and as a module of a user's package with a helper
    module: (env.name of the module, env.name of the package's, the package folder)."""
    # Names of their own: a test before this one in the same process may have registered the guide's "colour".
    (tmp_path / "resume_key_colour.py").write_text(COLOUR_ENV.read_text().replace('name = "colour"',
                                                                                 'name = "colour_module"'))
    package = tmp_path / "resume_key_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("SCALE = 1\n")
    (package / "env.py").write_text(COLOUR_ENV.read_text().replace('name = "colour"', 'name = "colour_pkg"')
                                    + "\nfrom resume_key_pkg.helpers import SCALE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with scoped_registrations():
        yield "resume_key_colour:ColourEnv", "resume_key_pkg.env:ColourEnv", package


def test_an_edited_plug_in_env_module_changes_the_resume_key(tmp_path, plug_in):
    module_env, _, _ = plug_in
    init = tmp_path / "init"
    init.mkdir()
    env = EnvParams(name=module_env)
    module = tmp_path / "resume_key_colour.py"
    assert list(env_sources(env).values()) == [module.resolve()]
    args = (tmp_path / "ckpt", SFTParams(), ModelParams(), env)
    first = resume_dir(*args, init_dir=init)
    assert resume_dir(*args, init_dir=init) == first
    module.write_text(module.read_text().replace("def ideal_answer", "def ideal_tool_calls(self, meta):\n"
                                                 "        return []\n\n    def ideal_answer"))
    assert resume_dir(*args, init_dir=init) != first


def test_every_module_of_a_plug_in_package_is_part_of_the_resume_key(tmp_path, plug_in):
    _, package_env, package = plug_in
    init = tmp_path / "init"
    init.mkdir()
    env = EnvParams(name=package_env)
    assert sorted(env_sources(env)) == ["resume_key_pkg/__init__.py", "resume_key_pkg/env.py",
                                        "resume_key_pkg/helpers.py"]
    args = (tmp_path / "ckpt", SFTParams(), ModelParams(), env)
    first = resume_dir(*args, init_dir=init)
    (package / "helpers.py").write_text("SCALE = 2\n")
    assert resume_dir(*args, init_dir=init) != first


def test_built_in_envs_have_no_sources_of_their_own():
    assert env_sources(EnvParams(name="geospot")) == {}  # vlmgym's own: source_identity covers them
