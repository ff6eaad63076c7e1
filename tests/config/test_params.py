"""params.yaml loading: typed sections, and errors that name the key, the value and the file."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vlmgym import params
from vlmgym.envs import Env, registry

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_repo_params_file_validates():
    sections = params.load_all(REPO / "params.yaml")
    assert set(sections) == set(params.SECTIONS)
    assert sections["data"].source in ("synthetic", "hub")


def test_defaults_fill_missing_keys(tmp_path):
    data = params.load_section("data", write(tmp_path, "data:\n  seed: 7\n"))
    assert data.seed == 7
    assert data.train_images == params.DataParams().train_images


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("data:\n  sed: 3\n", ["data.sed", "unknown key", "3"]),
        ("data:\n  seed: three\n", ["data.seed", "'three'", "integer"]),
        ("data:\n  seed: -1\n", ["data.seed", "-1", ">= 0"]),
        ("data:\n  source: ftp\n", ["data.source", "'ftp'", "synthetic"]),
        ("data:\n  seed: true\n", ["data.seed", "True", "integer"]),
        ("data:\n  countries: [FR]\n", ["data.countries", "unknown key", "geospot, message_decoding, mixture, nlvr2"]),
        ("data:\n  geospot:\n    countries: FR\n", ["data.geospot.countries", "'FR'", "list"]),
        ("env:\n  geospot:\n    tau_kms: [1]\n", ["env.geospot.tau_kms", "unknown key", "tau_km"]),
        ("env:\n  geospot:\n    format_weight: 2\n", ["env.geospot.format_weight", "<= 1"]),
        ("env:\n  geospot:\n    tau_km: [1.0]\n", ["env.geospot.tau_km", "expected 4 values"]),
        ("env:\n  nlvr2:\n    x: 1\n", ["env.nlvr2.x", "unknown key", "think"]),
        ("env:\n  name: no_such_env\n",
         ["env.name", "unknown env 'no_such_env'", "geospot, message_decoding, mixture, nlvr2"]),
        ("env:\n  name: no_such_module:Env\n", ["env.name", "cannot load"]),
        ("eval:\n  comparisons: [[grpo]]\n", ["eval.comparisons", "[treatment, control]"]),
        ("shard:\n  jpeg_quality: 101\n", ["shard.jpeg_quality", "101", "<= 100"]),
    ],
)
def test_bad_values_name_key_value_and_file(tmp_path, text, fragments):
    path = write(tmp_path, text)
    with pytest.raises(params.ParamsError) as err:
        params.load_all(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message


def test_unknown_section_is_an_error(tmp_path):
    with pytest.raises(params.ParamsError, match="unknown section"):
        params.load_all(write(tmp_path, "trian:\n  lr: 0.1\n"))


@pytest.mark.parametrize(("text", "key"), [
    ("train:\n  optimizer:\n    lr: .inf\n", "train.optimizer.lr"),
    ("sft:\n  optimizer:\n    lr: .nan\n", "sft.optimizer.lr"),
    ("train:\n  objective:\n    epsilon_high: -.inf\n", "train.objective.epsilon_high"),
    ("train:\n  epsilon_high: -.inf\n", "train.objective.epsilon_high"),  # the flat name, read as the nested key
    ("train:\n  optimizer:\n    max_grad_norm: 1e999\n", "train.optimizer.max_grad_norm"),  # a string, read as inf
    ("sft:\n  perception:\n    optimizer:\n      lr: .inf\n", "sft.perception.optimizer.lr"),
    ("env:\n  geospot:\n    tau_km: [1.0, .inf, 1.0, 1.0]\n", "env.geospot.tau_km[1]"),
])
def test_non_finite_numbers_are_refused_naming_the_key(tmp_path, text, key):
    path = write(tmp_path, text)
    for load in (params.load_all, lambda p: params.load_section("tracking", p)):
        with pytest.raises(params.ParamsError) as err:
            load(path)
        message = str(err.value)
        assert f"{key}: value" in message and "not a finite number" in message and "\n" not in message, message


@pytest.mark.parametrize(("algorithm", "filter_groups", "refused"), [
    ("grpo", False, True), ("rloo", False, True), ("online_dpo", False, True), ("ppo", False, False),
    ("ppo", True, True)])
def test_group_size_one_is_refused_where_groups_are_compared(tmp_path, algorithm, filter_groups, refused):
    path = write(tmp_path, f"train:\n  algorithm: {algorithm}\n  group_size: 1\n"
                           f"  filter_groups: {str(filter_groups).lower()}\n")
    if not refused:
        assert params.load_section("train", path).group_size == 1
        return
    with pytest.raises(params.ParamsError, match=r"train.group_size=1: .* needs train.group_size >= 2"):
        params.load_section("train", path)


def test_any_sections_load_validates_the_whole_file(tmp_path):
    path = write(tmp_path, "foo: 1\ntracking:\n  experiment: x\n")
    with pytest.raises(params.ParamsError, match=r"unknown section\(s\) \['foo'\]"):
        params.load_section("tracking", path)
    path.write_text("tracking:\n  experiment: x\neval:\n  seed: -1\n")  # another section's bad value
    with pytest.raises(params.ParamsError, match="eval.seed"):
        params.load_section("tracking", path)
    path.write_text("tracking:\n  experiment: y\n")  # a changed file is read again, not the cached one
    assert params.load_section("tracking", path).experiment == "y"


def test_a_loaded_section_is_a_copy_of_the_cached_one(tmp_path):
    path = write(tmp_path, "sft:\n  mesh: [1, 1, 1]\n")
    params.load_section("sft", path).mesh.append(2)
    assert params.load_section("sft", path).mesh == [1, 1, 1]


def test_ints_are_accepted_for_floats(tmp_path):
    model = params.load_section("model", write(tmp_path, "model:\n  parity_tolerance: 1\n"))
    assert model.parity_tolerance == 1.0 and isinstance(model.parity_tolerance, float)


def test_cli_reports_errors(tmp_path, capsys):
    assert params.main([str(write(tmp_path, "data:\n  seed: x\n"))]) == 1
    assert "data.seed" in capsys.readouterr().out
    assert params.main([str(REPO / "params.yaml")]) == 0


def test_exponent_without_dot_is_a_float(tmp_path):
    # YAML 1.1 (PyYAML) reads `3e-5` as a string; `dvc exp run -S train.optimizer.lr=3e-5` writes exactly that.
    train = params.load_section("train", write(tmp_path, "train:\n  optimizer:\n    lr: 3e-5\n"))
    assert train.optimizer.lr == 3e-5
    with pytest.raises(params.ParamsError, match="train.optimizer.lr"):
        params.load_section("train", write(tmp_path, "train:\n  optimizer:\n    lr: fast\n"))


def test_a_sub_section_keeps_its_holding_sections_defaults_for_the_keys_it_leaves_out(tmp_path):
    path = write(tmp_path, "sft:\n  optimizer:\n    weight_decay: 0.1\ntrain:\n  optimizer:\n    weight_decay: 0.1\n"
                           "  validation:\n    every: 10\n")
    sft, train = params.load_section("sft", path), params.load_section("train", path)
    assert (sft.optimizer.lr, sft.optimizer.warmup_steps, sft.optimizer.weight_decay) == (3e-3, 20, 0.1)
    assert (train.optimizer.lr, train.optimizer.warmup_steps, train.optimizer.weight_decay) == (1e-4, 5, 0.1)
    assert (train.validation.every, train.validation.select) == (10, "best_val")
    assert params.SFTParams().perception.optimizer.max_grad_norm == 0.0  # the warm-up clips nothing by default
    # an override of one key of a sub-section (compare's variants) keeps the file's other keys of it
    train = params.load_section("train", path, overrides={"optimizer": {"lr": 1e-3}})
    assert (train.optimizer.lr, train.optimizer.weight_decay, train.optimizer.warmup_steps) == (1e-3, 0.1, 5)


def test_env_sections_render_and_read_back(tmp_path):
    # every env's own section is written beside the section's keys, and reads back to the same dataclass
    sections = params.default_sections()
    path = write(tmp_path, params.render_yaml(sections))
    again = params.load_all(path)
    assert again["env"] == sections["env"] and again["data"] == sections["data"]
    assert again["env"].settings().tau_km == [2000.0, 500.0, 100.0, 25.0]
    assert params.to_dict(again["env"])["geospot"]["format_weight"] == 0.1


class NoSettingsEnv(Env):
    """An env without a Params section."""

    name = "no_settings"

    def prompt(self, sample):
        return "?"

    def score(self, state, text):
        return 0.0, {}


@pytest.mark.usefixtures("scoped_envs")
def test_an_env_without_params_takes_no_settings(tmp_path, monkeypatch):
    registry.register("no_settings", NoSettingsEnv)
    env = params.load_section("env", write(tmp_path, "env:\n  name: no_settings\n"))
    assert env.settings() is None
    with pytest.raises(params.ParamsError, match="env.no_settings.*takes no settings"):
        params.load_all(write(tmp_path, "env:\n  name: no_settings\n  no_settings:\n    x: 1\n"))


def test_settings_fall_back_to_the_env_defaults(tmp_path):
    env = params.load_section("env", write(tmp_path, "env:\n  name: nlvr2\n"))
    assert env.settings().think is False  # nlvr2's only settings: the think/answer option
    env = params.load_section("env", write(tmp_path, "env:\n  name: geospot\n"))
    assert env.settings().format_weight == 0.1


TRL_NAMED = """train:
  algorithm: dpo
  num_generations: 4
  max_completion_length: 32
  loss_type: grpo
  optimizer:
    min_lr_rate: 0.2
  lora:
    rank: 4
    target_modules: [q_proj, v_proj, down_proj]
sft:
  lora:
    rank: 2
    target_modules: all-linear
"""


def test_trl_and_peft_names_read_as_vlmgyms_and_print_canonical(tmp_path, capsys):
    path = write(tmp_path, TRL_NAMED)
    train = params.load_section("train", path)
    assert (train.algorithm, train.group_size, train.max_new_tokens, train.objective.loss_aggregation,
            train.optimizer.end_lr_ratio) == (
        "online_dpo", 4, 32, "sequence_mean", 0.2)
    assert train.lora.targets == ["q", "v", "down"]
    assert params.load_section("sft", path).lora.targets == list(params.LORA_TEXT_TARGETS)
    assert params.main([str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["group_size"] == 4 and "num_generations" not in printed["train"]
    assert printed["train"]["algorithm"] == "online_dpo"
    assert printed["train"]["objective"]["loss_aggregation"] == "sequence_mean" and "loss_type" not in printed["train"]
    assert printed["train"]["lora"]["targets"] == ["q", "v", "down"]


def test_an_alias_set_beside_its_key_in_the_params_file_replaces_it_and_says_so(tmp_path, capsys):
    path = write(tmp_path, "train:\n  group_size: 8\n  num_generations: 4\n  optimizer:\n    lr: 0.1\n"
                           "    learning_rate: 0.2\n")
    train = params.load_section("train", path)
    assert (train.group_size, train.optimizer.lr) == (4, 0.2)
    err = capsys.readouterr().err
    assert f"{path}: train.num_generations: 4 replaces train.group_size: 8" in err
    assert f"{path}: train.optimizer.learning_rate: 0.2 replaces train.optimizer.lr: 0.1" in err
    # two names of one key that are neither the file's own: which was set last cannot be told
    with pytest.raises(params.ParamsError, match="train.loss_type is another name for loss_aggregation"):
        params.load_section("train", write(tmp_path, "train:\n  loss_type: grpo\n  loss_aggregation: dr_grpo\n"))
    with pytest.raises(params.ParamsError, match="train.objective.loss_aggregation: value 'bnpo' is not one of"):
        params.load_section("train", write(tmp_path, "train:\n  loss_type: bnpo\n"))


# Every key of train.objective under the flat name params files used before it, and TRL's names, at values other
# than the defaults.
FLAT_OBJECTIVE = {"epsilon": 0.1, "epsilon_high": 0.3, "beta": 0.04, "loss_aggregation": "dr_grpo",
                  "scale_rewards": "batch", "importance_sampling_level": "sequence",
                  "sampler_correction": "token_truncate", "sampler_correction_cap": 2.0,
                  "sampler_correction_floor": 0.5, "mask_truncated_completions": True, "overlong_buffer": 4,
                  "overlong_penalty": 0.5, "top_entropy_quantile": 0.2}


def test_the_objectives_flat_names_read_into_train_objective_and_print_nested(tmp_path, capsys):
    assert set(FLAT_OBJECTIVE) == {f.name for f in dataclasses.fields(params.ObjectiveParams)}
    path = write(tmp_path, yaml.safe_dump({"train": {"old_logprobs": "learner", **FLAT_OBJECTIVE}}))
    train = params.load_section("train", path)
    assert train.objective == params.ObjectiveParams(**FLAT_OBJECTIVE) and train.old_logprobs == "learner"
    assert params.main([str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)["train"]
    assert printed["objective"] == FLAT_OBJECTIVE and not set(FLAT_OBJECTIVE) & set(printed)
    assert params.main([str(path), "--yaml"]) == 0
    text = capsys.readouterr().out
    assert "\n  objective:  # " in text and "\n    beta: 0.04  # " in text and "\n  beta:" not in text
    # written back as printed, the file loads to the same section
    assert params.load_section("train", write(tmp_path, text)) == train


def test_trls_flat_names_read_into_train_objective(tmp_path):
    path = write(tmp_path, "train:\n  beta: 0.04\n  epsilon: 0.1\n  epsilon_high: 0.3\n  loss_type: grpo\n"
                           "  scale_rewards: none\n  num_generations: 4\n  max_completion_length: 32\n")
    train = params.load_section("train", path)
    assert (train.objective.beta, train.objective.epsilon, train.objective.epsilon_high) == (0.04, 0.1, 0.3)
    assert (train.objective.loss_aggregation, train.objective.scale_rewards) == ("sequence_mean", "none")
    assert (train.group_size, train.max_new_tokens) == (4, 32)
    # TRL's loss_type inside the sub-section too
    nested = params.load_section("train", write(tmp_path, "train:\n  objective:\n    loss_type: dapo\n"))
    assert nested.objective.loss_aggregation == "token_mean"


@pytest.mark.parametrize(("text", "objective", "said"), [
    ("  beta: 0.1\n  objective:\n    beta: 0.2\n", {"beta": 0.1}, "train.beta: 0.1 replaces train.objective.beta: 0.2"),
    ("  loss_type: grpo\n  objective:\n    loss_aggregation: dr_grpo\n", {"loss_aggregation": "sequence_mean"},
     "train.loss_type: 'grpo' replaces train.objective.loss_aggregation: 'dr_grpo'"),
    ("  loss_aggregation: dr_grpo\n  objective:\n    loss_type: grpo\n", {"loss_aggregation": "dr_grpo"},
     "train.loss_aggregation: 'dr_grpo' replaces train.objective.loss_type: 'grpo'"),
])
def test_a_key_set_flat_beside_the_files_nested_one_replaces_it(tmp_path, capsys, text, objective, said):
    path = write(tmp_path, f"train:\n{text}")
    train = params.load_all(path)["train"]
    assert train.objective == dataclasses.replace(params.ObjectiveParams(), **objective)
    assert capsys.readouterr().err == f"{path}: {said}\n"


def test_two_flat_names_of_one_key_are_a_one_line_error_naming_both(tmp_path):
    path = write(tmp_path, "train:\n  loss_type: grpo\n  loss_aggregation: dr_grpo\n")
    with pytest.raises(params.ParamsError) as err:
        params.load_all(path)
    assert str(err.value) == f"{path}: train.loss_type is another name for loss_aggregation: give one of them"


def test_a_flat_objective_key_in_a_preset_replaces_the_nested_one(tmp_path):
    # a preset (or recipe) written before train.objective merges over a params file written after it, and the
    # other way round, without both spellings meeting in the result
    nested = {"train": {"objective": {"beta": 0.0, "epsilon": 0.1}}}
    flat = {"train": {"beta": 0.04, "loss_type": "grpo"}}
    raw = params.merged_params(nested, flat, "params.yaml", "preset.yaml")
    assert raw == {"train": {"objective": {"beta": 0.04, "epsilon": 0.1, "loss_aggregation": "grpo"}}}
    assert params.merged_params(flat, nested, "params.yaml", "preset.yaml") == {
        "train": {"objective": {"beta": 0.0, "epsilon": 0.1, "loss_aggregation": "grpo"}}}
    path = write(tmp_path, "# kept\n")
    train = params.write_params(raw, path, "the preset")["train"]
    assert (train.objective.beta, train.objective.loss_aggregation) == (0.04, "sequence_mean")
    assert path.read_text().startswith("# kept\n") and "\n  objective:" in path.read_text()


def test_dvc_set_param_of_a_flat_or_a_nested_objective_key_loads(tmp_path):
    from dvc.utils.hydra import apply_overrides

    old = write(tmp_path, "train:\n  beta: 0.0\n")  # a params file written before train.objective
    apply_overrides(old, ["train.beta=0.01"])
    assert params.load_section("train", old).objective.beta == 0.01
    new = tmp_path / "new.yaml"
    new.write_text(params.render_yaml())
    apply_overrides(new, ["train.objective.beta=0.02"])
    assert params.load_section("train", new).objective.beta == 0.02
    apply_overrides(new, ["+train.beta=0.03"])  # the flat name set on top of the file's nested key replaces it
    assert params.load_section("train", new).objective.beta == 0.03
    apply_overrides(new, ["+train.num_generations=3", "+train.optimizer.learning_rate=0.5"])  # TRL's names
    train = params.load_section("train", new)
    assert (train.group_size, train.optimizer.lr, train.objective.beta) == (3, 0.5, 0.03)


def test_an_override_of_a_nested_objective_key_replaces_a_files_flat_one(tmp_path):
    # what a study arm's settings do to a base params file written before train.objective
    path = write(tmp_path, "train:\n  beta: 0.0\n  epsilon: 0.1\n")
    train = params.load_section("train", path, overrides={"objective": {"beta": 0.01}})
    assert (train.objective.beta, train.objective.epsilon) == (0.01, 0.1)


def test_the_objective_section_is_hashable_for_the_jitted_step():
    assert hash(params.ObjectiveParams()) == hash(params.ObjectiveParams())
    assert params.ObjectiveParams(loss_aggregation="grpo").loss_aggregation == "sequence_mean"


def test_sections_built_in_code_take_the_aliases_too():
    assert params.TrainParams(algorithm="dpo").algorithm == "online_dpo"
    assert params.LoRAParams(targets=["gate_proj", "up"]).targets == ["gate", "up"]


CONFIG_ALONE = """
import dataclasses, sys
import vlmgym.config.sections, vlmgym.config.spec, vlmgym.config.subsections
from vlmgym.config.sections import DataParams
from vlmgym.config.spec import ParamsError, from_dict, spec
assert not [m for m in sys.modules if m.startswith(("vlmgym.envs", "vlmgym.params"))], sorted(sys.modules)

@dataclasses.dataclass(frozen=True)
class ToyData:
    size: int = spec(1, ge=1)

class Toy:  # what an env class gives validation: its name and its sections' dataclasses
    name, Params, DataParams = "toy", None, ToyData

class Lookup:
    def env_class(self, name):
        if name != "toy":
            raise KeyError(f"unknown env {name!r}")
        return Toy
    def is_known(self, name):
        return name == "toy"
    def names(self):
        return ["toy"]

data = from_dict(DataParams, {"seed": 3, "toy": {"size": 2}}, "data", envs=Lookup())
assert data.seed == 3 and data.sections == {"toy": ToyData(size=2)}
try:
    from_dict(DataParams, {"toy": {"size": 0}}, "data", envs=Lookup())
except ParamsError as err:
    assert "data.toy.size: value 0 out of range" in str(err), err
else:
    raise AssertionError("size 0 passed")
try:
    from_dict(DataParams, {"toy": {"size": 2}}, "data")
except TypeError as err:
    assert "envs=" in str(err), err
else:
    raise AssertionError("an env section validated without env lookups")
assert not [m for m in sys.modules if m.startswith(("vlmgym.envs", "vlmgym.params"))]
print("ok")
"""


def test_config_imports_no_env_and_validates_env_sections_with_the_lookup_passed_in():
    # vlmgym.config is beneath the envs: nothing installs an env lookup into it. A section holding envs' own
    # sections validates with the lookups its caller passes, and without them refuses rather than guessing.
    done = subprocess.run([sys.executable, "-c", CONFIG_ALONE], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
