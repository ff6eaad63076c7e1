"""What the sft and train stages share: a model folder as a Policy, the resume folder, the output."""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from vlmgym import envs
from vlmgym.data import shards
from vlmgym.envs.base import Env
from vlmgym.envs.tools import Tool
from vlmgym.models.checkpoint import load_checkpoint, save_checkpoint
from vlmgym.models.family import load_config
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.lora import LoRAConfig, init_adapters
from vlmgym.models.qwen3_vl.mesh import make_mesh, param_shardings
from vlmgym.models.qwen3_vl.processor import Processor
from vlmgym.params import EnvParams, ModelParams, SFTParams, TrainParams, to_dict
from vlmgym.rl import perception
from vlmgym.rl.dpo_trainer import DPOTrainer
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.loop import config_fingerprint
from vlmgym.rl.online import OnlineTrainer
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.ppo_trainer import PPOTrainer
from vlmgym.rl.sft_trainer import SFTTrainer, check_target_budget
from vlmgym.rollout.sampling import SamplingSettings
from vlmgym.runtime import distributed
from vlmgym.runtime.atomic import write_text_atomically


def load_policy(model_dir: str | Path, model_params: ModelParams, max_new_tokens: int, *, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0, mesh_shape: tuple[int, ...] = (),
                share_prefix: bool = True, remat: str = "none") -> tuple[Qwen3VLPolicy, Any]:
    """(policy, params) from a vlmgym JAX checkpoint folder, in the `model` section's dtypes.

    mesh_shape: (data, fsdp, tensor) device counts; empty (or all ones) keeps everything on one device.
    remat: the learner forward's activation checkpointing ("none" or "layer", see Qwen3VLLearner).
    """
    processor = Processor.from_pretrained(model_dir)
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                eos_ids=tuple(processor.eos_token_ids), pad_id=int(processor.pad_token_id))
    mesh = shardings = None
    if mesh_shape and int(np.prod(mesh_shape)) > 1:
        mesh = make_mesh(*mesh_shape)
        cfg = load_config(model_dir, dtype=model_params.dtype, param_dtype=model_params.param_dtype)
        shardings = param_shardings(cfg, mesh)
    cfg, params = load_checkpoint(model_dir, dtype=model_params.dtype, param_dtype=model_params.param_dtype,
                                  shardings=shardings)
    return Qwen3VLPolicy(cfg, processor, settings, mesh=mesh, share_prefix=share_prefix, remat=remat), params


def validation_env(stage: str, section: SFTParams | TrainParams, env_params: EnvParams, tokenizer: Any) -> Any:
    """The env over the val split that `<stage>.validation.every` validates on, or None when it is 0."""
    every = section.validation.every
    if every == 0:
        return None
    for folder in envs.split_dirs(env_params, section.shards_dir, "val"):
        if not folder.is_dir():
            raise FileNotFoundError(f"{stage}.validation.every={every} validates on {folder}, which the shard "
                                    f"stage did not write: set shard.val_samples > 0 (or {stage}.validation.every: 0)")
    return envs.from_params(env_params, shards_dir=section.shards_dir, split="val", tokenizer=tokenizer)


def prompt_split(stage: str, shards_dir: str, env_params: EnvParams) -> str:
    """The split a stage trains on: train, except that the train stage samples the rl split where the shard stage
    held one out (`shard.rl_samples`): prompts SFT never read."""
    if stage == "train" and all(folder.is_dir() for folder in envs.split_dirs(env_params, shards_dir, "rl")):
        return "rl"
    return "train"


def stage_mesh(section: SFTParams | TrainParams) -> tuple[int, ...]:
    """The (data, fsdp, tensor) mesh of a stage section; over several processes an empty `mesh` means data
    parallelism over every process's devices."""
    if not section.mesh and distributed.count() > 1:
        return (jax.device_count(), 1, 1)
    return tuple(section.mesh)


def stage_policy(stage: str, section: SFTParams | TrainParams, model_params: ModelParams) -> tuple[Qwen3VLPolicy, Any]:
    """(policy, params) of `section.init_dir` as stage `stage` (sft: teacher-forced targets; train: sampling)
    needs it; with `section.lora.rank` > 0 the params carry fresh adapters (B = 0: the start model's outputs)."""
    if stage == "sft":
        policy, params = load_policy(section.init_dir, model_params, section.max_target_tokens,
                                     mesh_shape=stage_mesh(section), remat=section.remat)
    else:
        policy, params = load_policy(section.init_dir, model_params, section.max_new_tokens,
                                     temperature=section.sampling.temperature, top_k=section.sampling.top_k,
                                     top_p=section.sampling.top_p,
                                     mesh_shape=stage_mesh(section), share_prefix=section.share_prefix,
                                     remat=section.remat)
    adapters = LoRAConfig.from_section(section.lora)
    if adapters is not None:
        params = init_adapters(params, policy.cfg, adapters)
    return policy, params


def check_sft_budget(section: SFTParams, policy: Any, env_params: EnvParams) -> None:
    """Fail before any warm-up or step when the train split's SFT targets do not fit sft.max_target_tokens."""
    tokenizer = policy.processor.tokenizer
    env = envs.from_params(env_params, shards_dir=section.shards_dir, split="train", tokenizer=tokenizer)
    check_target_budget(policy, env, samples=4 * section.batch_size)


def warm_perception(section: SFTParams, policy: Any, params: Any, env_params: EnvParams, checkpoints: Path,
                    log: perception.Log | None = None) -> tuple[Any, dict[str, float]]:
    """params with the vision tower warmed up on the env's image labels (`section.perception`, vlmgym.rl.perception)
    over the train split, measured on the val split where the shard stage wrote one."""
    tokenizer = policy.processor.tokenizer
    env = envs.from_params(env_params, shards_dir=section.shards_dir, split="train", tokenizer=tokenizer)
    has_val = all(folder.is_dir() for folder in envs.split_dirs(env_params, section.shards_dir, "val"))
    val_env = (envs.from_params(env_params, shards_dir=section.shards_dir, split="val", tokenizer=tokenizer)
               if has_val else None)
    return perception.warm_up(policy, params, env, val_env, section, checkpoints, distributed.count(), log=log)


# The train stage's trainer of each train.algorithm: every one a loop over the shared sampler (vlmgym.rl.online)
# with its own update.
TRAINERS: dict[str, type[OnlineTrainer]] = {"grpo": GRPOTrainer, "rloo": GRPOTrainer, "ppo": PPOTrainer,
                                            "online_dpo": DPOTrainer}


def trainer_class(stage: str, algorithm: str | None) -> type:
    """The trainer of a stage: SFTTrainer for sft; for train, TRAINERS[train.algorithm]."""
    if stage == "sft":
        return SFTTrainer
    if algorithm not in TRAINERS:
        raise ValueError(f"train.algorithm {algorithm!r} has no trainer")
    return TRAINERS[algorithm]


def stage_trainer(stage: str, section: SFTParams | TrainParams, policy: Any, params: Any, env_params: EnvParams,
                  checkpoints: Path, **callbacks: Any) -> Any:
    """The trainer of stage `stage` (trainer_class) over its prompt split (prompt_split), validating on the val split
    when `section.validation.every` says so."""
    tokenizer = policy.processor.tokenizer
    split = prompt_split(stage, section.shards_dir, env_params)
    if split != "train":
        print(f"{stage}: sampling prompts from the {split} split (shard.rl_samples), which SFT never reads")
    env = envs.from_params(env_params, shards_dir=section.shards_dir, split=split, tokenizer=tokenizer)
    val_env = validation_env(stage, section, env_params, tokenizer)
    trainer = trainer_class(stage, getattr(section, "algorithm", None))(policy, env, params, section, checkpoints,
                                                                       val_env=val_env, **callbacks)
    if lora.has_adapters(params):  # checkpoints hold the adapters alone: they name the base they sit on
        trainer.base_identity = folder_identity(section.init_dir)
    return trainer


def folder_identity(folder: str | Path, every_byte: bool = False) -> str:
    """A cheap identity of a model folder: hash of its small files plus the sizes and names of the rest
    (`every_byte`: the content of every file, e.g. data whose large files change at the same size)."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file():
            continue
        digest.update(str(path.relative_to(folder)).encode())
        size = path.stat().st_size
        if not every_byte and size >= 1 << 20:
            digest.update(str(size).encode())
            continue
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


PACKAGE = Path(__file__).resolve().parents[1]  # src/vlmgym


def source_identity() -> str:
    """A hash of the vlmgym package's Python sources: a run is only resumed by the code that started it."""
    return _sources_identity({str(path.relative_to(PACKAGE)): path for path in PACKAGE.rglob("*.py")})


def _sources_identity(files: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    for name, path in sorted(files.items()):
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def env_source_identity(env_params: EnvParams) -> str:
    """A hash of the configured env's own sources outside vlmgym (env_sources)."""
    return _sources_identity(env_sources(env_params))


def env_sources(env_params: EnvParams) -> dict[str, Path]:
    """The Python files outside vlmgym that define the configured env, by a name that stays the same wherever the
    checkout lies: for the env (and each env it combines), its tools and their base classes, every .py file of the
    package that holds each one's module, or the module file alone where it is in no package (a module beside
    params.yaml)."""
    classes: list[type] = []
    for name in dict.fromkeys([env_params.name, *envs.parts(env_params)]):
        cls = envs.env_class(name)
        classes += [base for base in cls.__mro__ if issubclass(base, Env)]
        for tool in cls.tool_classes.values():
            classes += [base for base in tool.__mro__ if issubclass(base, Tool)]
    files: dict[str, Path] = {}
    for cls in classes:
        files.update(_module_sources(cls))
    return files


def _module_sources(cls: type) -> dict[str, Path]:
    try:
        path = Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):  # a class made in memory (a notebook's): no file to hash
        return {}
    if path.is_relative_to(PACKAGE):
        return {}  # source_identity's
    top = cls.__module__.partition(".")[0]
    folders = [Path(folder).resolve() for folder in getattr(sys.modules.get(top), "__path__", [])]
    if not folders:
        return {path.name: path}
    return {f"{top}/{p.relative_to(folder)}": p for folder in folders for p in folder.rglob("*.py")}


def stage_splits(section: SFTParams | TrainParams, env_params: EnvParams) -> list[str]:
    """The splits a stage reads: the one it trains on (prompt_split) and val (validation, the perception
    warm-up's measure)."""
    stage = "sft" if isinstance(section, SFTParams) else "train"
    return list(dict.fromkeys([prompt_split(stage, section.shards_dir, env_params), "val"]))


def data_identity(section: SFTParams | TrainParams, env_params: EnvParams) -> dict[str, str | None]:
    """{split folder: hash of its tars' content} over the splits a stage reads (None: the folder is not there)."""
    return {str(folder): shards.split_identity(folder.parent, folder.name)
            for split in stage_splits(section, env_params)
            for folder in envs.split_dirs(env_params, section.shards_dir, split)}


def resume_dir(base: str | Path, section: SFTParams | TrainParams, model: ModelParams, env_params: EnvParams, *,
               init_dir: str | Path) -> Path:
    """The checkpoint folder of this exact run: its params, the content of its start model (weights, config,
    tokenizer) and of the shards it reads, vlmgym's sources and the env's own outside vlmgym (env_sources). A run
    whose inputs changed in any way never resumes it: DVC reruns a stage when an input changes, and resuming that
    stage's finished run would write the old model again."""
    config = {"sections": [to_dict(s) for s in (section, model, env_params)],
              "init": folder_identity(init_dir, every_byte=True), "data": data_identity(section, env_params),
              "code": source_identity(), "env_code": env_source_identity(env_params)}
    return Path(base) / config_fingerprint(config)


def save_model(out_dir: str | Path, policy: Qwen3VLPolicy, params: Any, init_dir: str | Path,
               lora_dropout: float = 0.0) -> Path:
    """Write the trained params as a model folder (config + tokenizer files copied from init_dir), atomically.

    With LoRA adapters the folder holds the merged model (every later stage reads a plain model) and, in
    `adapter/`, the adapters alone in PEFT's layout, naming init_dir (and its folder hash) as their base and
    `lora_dropout` as the rate they were trained with."""
    hf_config = json.loads((Path(init_dir) / "config.json").read_text())
    extra = None
    if lora.has_adapters(params):
        identity, adapted = folder_identity(init_dir), params

        def extra(tmp: Path) -> None:
            lora.write_peft_adapter(tmp / lora.ADAPTER_DIR, adapted, str(init_dir), identity, lora_dropout)

        params = lora.merge(params)
    return save_checkpoint(out_dir, policy.cfg, params, hf_config=hf_config, side_files_from=init_dir, extra=extra)


def write_json_atomically(path: str | Path, obj: Any) -> None:
    """Small metrics files (metrics/sft.json, metrics/train.json), through a temp file and a rename."""
    write_text_atomically(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def history_summary(history: list[dict], names: tuple[str, ...], steps: int) -> dict[str, float]:
    """Mean of each named figure over the last `steps` steps of a training history (the DVC metrics file)."""
    last = history[-steps:]
    return {name: sum(m[name] for m in last) / len(last) for name in names if last and name in last[0]}


def selection_summary(trainer: Any) -> dict[str, float]:
    """What validation said, for the stage's DVC metrics file: the step the saved model comes from, the best and
    the last greedy val reward (empty without validation)."""
    validator = trainer.validator
    if validator is None or validator.best_step is None:
        return {}
    validated = [m for m in trainer.restored_history + trainer.history if "val/reward_greedy" in m]
    out = {"selected_step": trainer.final_step, "val_reward_greedy_best": validator.best_score,
           "val_best_step": validator.best_step}
    if validated:
        out["val_reward_greedy_last"] = validated[-1]["val/reward_greedy"]
    if validator.stopped_at is not None:
        out["early_stopped_at"] = validator.stopped_at
    return out
