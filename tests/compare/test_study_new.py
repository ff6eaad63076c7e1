"""`vlmgym study new` and a study's settings: the params.yaml and dvc.yaml it writes, the checks on the settings,
the code the stages depend on (no training here; tests/compare/test_study_pipeline.py runs a study)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vlmgym.compare import layout, settings
from vlmgym.params import ParamsError
from vlmgym.runtime.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """An empty repository root: .dvc/ and a params file (the defaults: geospot, train selects best_val)."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": {"validation": {"select": "best_val"}}}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_new_writes_the_settings_and_a_pipeline_of_matrix_stages(repo):
    study = layout.new_study("rl-vs-sft", seeds=[5, 6], arms=["grpo", "sft_longer"])
    raw = yaml.safe_load((repo / "studies/rl-vs-sft/params.yaml").read_text())
    assert raw == {"study": {"base_params": "../../params.yaml", "env": "geospot", "seeds": [5, 6],
                             "arms": ["grpo", "sft_longer"], "select": "best_val"},
                   "arm": {"grpo": {}, "sft_longer": {}}, "start": {}}
    assert settings.load("studies/rl-vs-sft") == study and study.base_params == Path("params.yaml")
    stages = yaml.safe_load((repo / "studies/rl-vs-sft/dvc.yaml").read_text())["stages"]
    assert list(stages) == ["start", "arm", "blind", "constant", "report"]
    arm = stages["arm"]
    assert arm["matrix"] == {"seed": "${study.seeds}", "arm": "${study.arms}"} and arm["wdir"] == "../.."
    assert arm["cmd"] == "vlmgym study arm studies/rl-vs-sft --seed ${item.seed} --arm ${item.arm}"
    assert arm["outs"] == ["studies/rl-vs-sft/runs/${item.seed}/${item.arm}"]
    assert arm["deps"][-2:] == ["data/shards", "studies/rl-vs-sft/runs/${item.seed}/sft"]
    assert arm["params"] == [{"params.yaml": ["sft", "train", "model", "env", "rollout"]},
                             {"studies/rl-vs-sft/params.yaml": ["study.env", "study.select", "arm.${item.arm}"]}]
    assert stages["start"]["deps"][-2:] == ["models/jax/base", "data/shards"]
    assert stages["start"]["params"][-1] == {"studies/rl-vs-sft/params.yaml": ["start"]}
    assert stages["report"]["deps"] == ["studies/rl-vs-sft/runs"]  # vlmgym's sources live elsewhere here
    assert stages["report"]["outs"] == [{f"studies/rl-vs-sft/report.{kind}": {"cache": False}}
                                        for kind in ("md", "json", "png")]
    paths = layout.stage_paths(study, "arm", {"seed": 6, "arm": "grpo"})
    assert paths["outs"] == ["studies/rl-vs-sft/runs/6/grpo"] and "studies/rl-vs-sft/runs/6/sft" in paths["deps"]


def test_new_refuses_an_existing_study_a_wrong_env_and_a_folder_outside_a_repository(repo, monkeypatch):
    layout.new_study("a", seeds=[1])
    with pytest.raises(UserError, match="studies/a exists: its settings are fixed"):
        layout.new_study("a", seeds=[2])
    assert layout.new_study("a", seeds=[2], rewrite=True).seeds == (2,)
    with pytest.raises(UserError, match="a study's name is a folder name"):
        layout.new_study("../b")
    monkeypatch.chdir(repo / "studies")
    with pytest.raises(UserError, match="run it from the repository root"):
        layout.new_study("c")


@pytest.mark.parametrize(("change", "message"), [
    ({"seeds": []}, "study.seeds: expected a list of distinct seeds"),
    ({"seeds": [1, 1]}, "study.seeds: expected a list of distinct seeds"),
    ({"arms": ["grpo", "grpo"]}, "study.arms: expected a list of distinct arm names"),
    ({"arms": ["sft"]}, "study.arms: 'sft' is not an arm"),
    ({"arms": ["ppo"]}, "arm.ppo: missing"),
    ({"arms": ["gspo"]}, "arm.gspo: missing"),
    ({"select": "best"}, "study.select: expected one of last, best_val"),
    ({"seed": 3}, "study.seed: unknown key"),
    ({"base_params": "nowhere.yaml"}, "study.base_params 'nowhere.yaml': no such file"),
])
def test_wrong_settings_are_one_line_naming_the_key(repo, change, message):
    study = layout.new_study("s", seeds=[5])
    raw = yaml.safe_load(study.params_file.read_text())
    raw["study"].update(change)
    study.params_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match=message) as raised:
        settings.load("studies/s")
    assert str(raised.value).startswith("studies/s/params.yaml: ") and "\n" not in str(raised.value)


def test_a_variant_needs_settings_and_is_paired_with_its_algorithms_arm_and_with_sft_longer(repo):
    with pytest.raises(ParamsError, match="arm.gspo: 'gspo' is not one of .* needs settings"):
        layout.new_study("v", arms=["grpo", "gspo"], settings={"gspo": {}})
    study = layout.new_study("v", arms=["sft_longer", "grpo", "gspo"],
                             settings={"gspo": {"importance_sampling_level": "sequence"}})
    assert study.arm_settings("gspo") == {"objective.importance_sampling_level": "sequence"}
    assert settings.comparisons(study, study.sections()) == [
        ("grpo", "sft_longer"), ("gspo", "sft_longer"), ("gspo", "grpo")]
    with pytest.raises(ParamsError, match="arm.grpo.seed: set by the study"):
        layout.new_study("w", arms=["grpo"], settings={"grpo": {"seed": 1}})
    assert not (repo / "studies/w").exists()  # nothing written for settings that fail


def test_ppo_is_refused_up_front_for_an_env_with_tools(repo):
    (repo / "params.yaml").write_text(yaml.safe_dump({"env": {"name": "digits", "recipe": "",
                                                              "digits": {"tools": ["zoom"], "max_turns": 2}}}))
    with pytest.raises(ParamsError, match="env 'digits' runs episodes with tools, which PPO does not train"):
        layout.new_study("t", arms=["grpo", "ppo"])


def test_the_stages_depend_on_every_vlmgym_package_they_import(monkeypatch):
    monkeypatch.chdir(REPO)
    deps = layout.code_deps()
    for package in ("compare", "rl", "models", "eval", "envs", "tracking", "runtime", "config"):
        assert f"src/vlmgym/{package}" in deps
    # the dispatcher alone of the cli package, and nothing the stages never run
    assert "src/vlmgym/cli/__init__.py" in deps and "src/vlmgym/cli" not in deps
    assert not any(d.startswith(("src/vlmgym/bench", "src/vlmgym/plan")) for d in deps)


def test_the_starts_settings_change_the_sft_section_it_trains_with_and_nothing_else(repo):
    from vlmgym.compare.seeds import start_config

    study = layout.new_study("long-start", seeds=[5], arms=["grpo", "sft_longer"], start={"steps": 1800})
    assert yaml.safe_load(study.params_file.read_text())["start"] == {"steps": 1800}
    assert study.start_settings() == {"steps": 1800}
    sections = study.sections()
    config = start_config(sections, 5, study.run_folder(5), study.checkpoints(5), study.start_settings())
    assert config.steps == 1800 and config.seed == 5 and sections["sft"].steps != 1800
    assert config.out_dir == "studies/long-start/runs/5/sft/model"
    raw = yaml.safe_load(study.params_file.read_text())
    raw["start"] = {"optimizer": {"lr": "fast"}}
    study.params_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match="start: .*lr"):
        settings.load(study.folder).start_settings()
    raw["start"] = {"seed": 3}
    study.params_file.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match="start.seed: set by the study"):
        settings.load(study.folder).start_settings()


def test_a_study_of_another_env_gets_its_own_pipeline_params_and_first_stages(repo):
    import shutil

    from vlmgym.params import load_section

    shutil.copy(REPO / "dvc.yaml", repo / "dvc.yaml")  # the repository pipeline whose first stages it copies
    study = layout.new_study("pairs", env="nlvr2", seeds=[5], arms=["grpo", "sft_longer"])
    pipeline = repo / "studies/pairs/pipeline.yaml"
    assert study.base_params == Path("studies/pairs/pipeline.yaml") and study.env == "nlvr2"
    assert yaml.safe_load(study.params_file.read_text())["study"]["base_params"] == "pipeline.yaml"
    env, sft = load_section("env", pipeline), load_section("sft", pipeline)
    assert env.name == env.recipe == "nlvr2"
    # nlvr2's recipe, as `vlmgym recipe nlvr2` writes it, and its data and base model under the study's folder
    assert sft.init_dir == "studies/pairs/models/jax/base" and sft.shards_dir == "studies/pairs/data/shards"
    assert load_section("data", pipeline).raw_dir == "studies/pairs/data/raw"
    assert load_section("rollout", pipeline).shards_dir == load_section("train", pipeline).shards_dir == sft.shards_dir
    stages = yaml.safe_load((repo / "studies/pairs/dvc.yaml").read_text())["stages"]
    assert list(stages)[:5] == ["download", "shard", "base_model", "convert", "start"]
    shard = stages["shard"]
    assert shard["cmd"] == "python stages/shard.py --params studies/pairs/pipeline.yaml" and shard["wdir"] == "../.."
    assert "stages/shard.py" in shard["deps"] and shard["deps"][-1] == "studies/pairs/data/raw"
    assert len(set(shard["deps"])) == len(shard["deps"])
    assert shard["outs"] == ["studies/pairs/data/shards"]
    assert shard["params"] == [{"studies/pairs/pipeline.yaml": ["env.name", "data.raw_dir", "shard"]}]
    assert stages["convert"]["outs"] == ["studies/pairs/models/jax/base"]
    assert stages["start"]["deps"][-2:] == ["studies/pairs/models/jax/base", "studies/pairs/data/shards"]
    # the repository's own params are untouched
    assert load_section("env", repo / "params.yaml").name == "geospot"



def test_a_study_on_another_studys_pipeline_keeps_its_settings_and_moves_its_folders_not_nested(repo):
    import shutil

    from vlmgym.compare import own_data
    from vlmgym.params import load_section, value_at
    from vlmgym.recipes import paths, recipe_overlay

    shutil.copy(REPO / "dvc.yaml", repo / "dvc.yaml")
    layout.new_study("pairs", env="nlvr2", seeds=[5], arms=["grpo"])
    first = repo / "studies/pairs/pipeline.yaml"
    tuned = yaml.safe_load(first.read_text())
    tuned["train"]["sampling"]["temperature"] = 0.3  # a change by hand over nlvr2's recipe
    first.write_text(yaml.safe_dump(tuned))
    # a pipeline of its own on the same env (as a forgetting study writes one): the base's settings stay
    second = own_data.write_pipeline(Path("studies/pairs-again"), "studies/pairs/pipeline.yaml", "nlvr2")
    assert load_section("train", second).sampling.temperature == 0.3
    assert load_section("data", second).raw_dir == "studies/pairs-again/data/raw"
    assert load_section("model", second).jax_dir == load_section("sft", second).init_dir == \
        "studies/pairs-again/models/jax/base"
    assert load_section("shard", second).out_dir == load_section("rollout", second).shards_dir == \
        "studies/pairs-again/data/shards"
    # switching env applies the new env's recipe over the base's settings, the hand change included
    layout.new_study("pairs-geo", base_params="studies/pairs/pipeline.yaml", env="geospot", seeds=[6], arms=["grpo"])
    third = repo / "studies/pairs-geo/pipeline.yaml"
    overlay = dict(paths(recipe_overlay("geospot")))
    assert ("train", "sampling", "temperature") in overlay
    for (section, *keys), value in overlay.items():
        assert value_at(load_section(section, third), ".".join(keys)) == value, (section, keys)
    assert load_section("data", third).raw_dir == "studies/pairs-geo/data/raw"
    assert load_section("sft", third).shards_dir == "studies/pairs-geo/data/shards"


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (REPO / "studies").glob("*/pipeline.yaml")))
def test_a_committed_studys_first_stages_read_what_the_repositorys_read_now(folder, monkeypatch):
    """A study with its own data and base model copies the repository's first stages: when those gain a param
    (a model key), the study's copies must too, or changing that key in its pipeline.yaml rebuilds nothing."""
    from vlmgym.compare import own_data

    monkeypatch.chdir(REPO)
    written = yaml.safe_load((REPO / "studies" / folder / "dvc.yaml").read_text())["stages"]
    expected = own_data.head_stages(Path("studies") / folder / own_data.PIPELINE, [])
    for name, stage in expected.items():
        assert {k: written[name][k] for k in ("cmd", "params", "outs")} == \
            {k: stage[k] for k in ("cmd", "params", "outs")}, name
        assert [d for d in written[name]["deps"] if not d.startswith(("src/", "plugins"))] == \
            [d for d in stage["deps"] if d != "plugins"], name
