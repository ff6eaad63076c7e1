"""The arms of a study: what each trains with, from which start, and its greedy answers on the held-out splits.

Every arm starts from its seed's SFT start, `sft` (the control, vlmgym.compare.seeds):
- grpo, ppo, dpo, rloo: the train section with `train.algorithm` set to the arm. The budget is matched in sampled
  completions: every RL arm samples, scores and learns from train.steps x batch_prompts x group_size answers (DPO
  learns from the best/worst pair of each).
- sft_longer: SFT continued from the start on the env's ideal answers for as many training sequences as an RL arm
  samples (ceil(train.steps x batch_prompts x group_size / sft.batch_size) steps of the sft section's settings):
  what supervised data alone buys with the same number of sequences.
- sft_compute: the same SFT continued for as many training FLOPs as a step of the train section costs times its
  steps (sft_compute_steps: sampling, reference and learner passes counted by the 2N / 6N rule per token position):
  what supervised data alone buys with the same compute.
- a variant, any other name: the train section with the study's settings for it (e.g. GSPO:
  objective.importance_sampling_level: sequence), against the arm of its train.algorithm at the same budget.
Each arm ends on the params its validation selects, by the one rule the study sets for all of them
(`validation.select`). Beside the arms, two image-blind baselines answer the same splits (vlmgym.eval.blind):
`constant`, the best constant answer chosen on val, and `sft_blind`, the start answering with its images blanked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.eval.blind import CONSTANT, blind_name
from vlmgym.params import SFTParams, TrainParams, with_values

CONTROL = "sft"  # the arm every other is compared with: each seed's SFT start
RL_ARMS = ("grpo", "ppo", "dpo", "rloo")
# More SFT from the same start, the controls for "RL helps": at the RL arms' number of trained sequences, and at their
# training compute.
SFT_CONTROLS = ("sft_longer", "sft_compute")
ARMS = (*SFT_CONTROLS, *RL_ARMS)
PROMPTS_MEASURED = 64  # train prompts whose token count gives sft_compute's prompt length
SPLITS = ("test", "test_ood")
# The image-blind baselines beside the arms (vlmgym.eval.blind): the best constant answer, chosen on val, and the
# start policy answering with its images blanked.
BLIND = blind_name(CONTROL)
BASELINES = (CONSTANT, BLIND)
RESERVED = (CONTROL, *BASELINES)
# Keys an arm's settings may not change: the study sets them (each seed's start, seed and folders; the one selection
# rule), and the budget every arm shares comes from the base params' train section (sft_longer's steps follow it).
STUDY_KEYS = ("seed", "init_dir", "out_dir", "shards_dir", "checkpointing.dir", "validation.select")
BUDGET_KEYS = {"train": ("steps", "batch_prompts", "group_size"), "sft": ("steps",)}


def sft_longer_steps(train: TrainParams, sft: SFTParams) -> int:
    """SFT steps that train on as many sequences as an RL arm samples."""
    return math.ceil(train.steps * train.batch_prompts * train.group_size / sft.batch_size)


def rl_step_flops(train: TrainParams, prompt_tokens: float) -> float:
    """FLOPs of one step of the train section per model parameter, by the 2N (forward) / 6N (forward and backward)
    rule per token position the step computes: the sampler's prefill (once per prompt) and decode (every answer to
    max_new_tokens: the arrays' fixed shape, an upper bound where answers end early), the learner's passes over the
    prompts (once per group with share_prefix) and the answers, a reference forward when beta > 0 and a learner
    recomputation of the behaviour log-probs with old_logprobs: learner. filter_groups' extra sampling rounds and
    validation are left out."""
    prompts, answers = train.batch_prompts, train.batch_prompts * train.group_size
    sampled = prompts * prompt_tokens + answers * train.max_new_tokens
    learned = (prompts if train.share_prefix else answers) * prompt_tokens + answers * train.max_new_tokens
    forwards = sampled + learned * ((train.objective.beta > 0) + (train.old_logprobs == "learner"))
    return 2 * forwards + 6 * learned * train.num_iterations


def sft_step_flops(sft: SFTParams, prompt_tokens: float) -> float:
    """FLOPs of one SFT step per model parameter: forward and backward (6N) over each sample's prompt and its
    max_target_tokens answer positions."""
    return 6 * sft.batch_size * (prompt_tokens + sft.max_target_tokens)


def sft_compute_steps(train: TrainParams, sft: SFTParams, prompt_tokens: float) -> int:
    """SFT steps that cost what the train section's steps cost (rl_step_flops, sft_step_flops)."""
    return math.ceil(train.steps * rl_step_flops(train, prompt_tokens) / sft_step_flops(sft, prompt_tokens))


def mean_prompt_tokens(sections: dict[str, Any], count: int = PROMPTS_MEASURED) -> float:
    """The mean prompt length in tokens (image tokens included, no padding) of the first `count` train samples, as
    the base model's processor encodes them."""
    from vlmgym.eval.answering import open_env
    from vlmgym.models.qwen3_vl.processor import Processor

    processor = Processor.from_pretrained(sections["sft"].init_dir)
    env = open_env(sections["env"], sections["rollout"], sections["train"].shards_dir, "train", processor.tokenizer,
                   count)
    observations = [env.reset(index)[1] for index in range(len(env))]
    lengths = [processor([obs["messages"]], [list(obs.get("images") or [])])["input_ids"].shape[1]
               for obs in observations]
    return float(np.mean(lengths))


def arm_section(arm: str) -> str:
    """The params section an arm trains with, and the stage it trains as: sft for the SFT controls and the control
    (which trains only as a seed's SFT start), train for every RL arm and variant."""
    return "sft" if arm in (*SFT_CONTROLS, CONTROL) else "train"


def dotted(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: {"optimizer": {"lr": 1e-5}} -> {"optimizer.lr": 1e-5}."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        out.update(dotted(value, f"{name}.") if isinstance(value, Mapping) else {name: value})
    return out


def validated_settings(arm: str, settings: Mapping[str, Any], params_file: str | Path,
                       where: str, own: tuple[str, ...] = ()) -> dict[str, Any]:
    """An arm's (or, `arm` the control, the seeds' start's) settings as dotted keys of its section (arm_section)
    under their canonical names (TRL's accepted), validated as that section of `params_file` would be with them; a
    ParamsError names `where` and the key. `own`: keys the study otherwise sets that these settings may (a forgetting
    study's points each train for their own number of steps, its generalist selects by its own rule)."""
    from vlmgym.params import ParamsError, canonical_paths, load_section, nested_keys, value_at

    section = arm_section(arm)
    keys = canonical_paths(SFTParams if section == "sft" else TrainParams, dotted(settings), where)
    for key in keys:
        if key in own:
            continue
        if key in STUDY_KEYS or (key == "algorithm" and arm in RL_ARMS):
            raise ParamsError(f"{where}.{key}: set by the study (each seed's start, seed and folders; study.select "
                              "for every arm; an RL arm's name is its algorithm): leave it out")
        if key in BUDGET_KEYS[section] and arm != CONTROL:  # the start's own length is its setting
            raise ParamsError(f"{where}.{key}: every arm trains at the budget of {params_file}'s train section "
                              "(sft_longer on as many sequences): change it there, for all arms")
    try:
        validated = load_section(section, params_file, overrides=nested_keys(keys))
    except ParamsError as err:
        raise ParamsError(f"{where}: {err}") from err
    return {key: value_at(validated, key) for key in keys}


def arm_config(arm: str, sections: dict[str, Any], out: Path, checkpoints: Path,
               settings: Mapping[str, Any] | None = None, select: str | None = None) -> SFTParams | TrainParams:
    """The sft or train section an arm trains with from `train.init_dir` (its seed's start), its model under
    `out`/<arm>/model and checkpoints under `checkpoints`/<arm>; `settings` (validated_settings) changed, and with
    `select` every arm's validation.select. An arm not in ARMS is a variant: the train section with its settings."""
    train, sft = sections["train"], sections["sft"]
    if arm in SFT_CONTROLS:  # continue the SFT model, whose tower any perception warm-up has already warmed
        steps = (sft_longer_steps(train, sft) if arm == "sft_longer"
                 else sft_compute_steps(train, sft, mean_prompt_tokens(sections)))
        base: SFTParams | TrainParams = replace(
            sft, steps=steps, init_dir=train.init_dir, shards_dir=train.shards_dir,
            perception=replace(sft.perception, steps=0))
    elif arm in RL_ARMS:
        base = replace(train, algorithm=arm)
    elif settings:
        base = train
    else:
        raise ValueError(f"unknown arm {arm!r}: expected one of {', '.join(ARMS)}, or a variant of the train section "
                         "with settings of its own")
    chosen = {} if select is None else {"validation.select": select}
    return with_values(base, {**(settings or {}), **chosen, "out_dir": str(out / arm / "model"),
                              "checkpointing.dir": str(checkpoints / arm)})


def arm_checkpoints(arm: str, config: SFTParams | TrainParams, sections: dict[str, Any]) -> Path | None:
    """The resumable checkpoint folder of an arm's training (None: 0 steps, nothing to resume)."""
    from vlmgym.rl.stage_setup import resume_dir

    if not config.steps:
        return None
    return resume_dir(config.checkpointing.dir, config, sections["model"], sections["env"], init_dir=config.init_dir)


def train_arm(arm: str, config: SFTParams | TrainParams, sections: dict[str, Any], log_metrics: Any,
              samples_callback: Any = None) -> tuple[Path, dict[str, float]]:
    """Train one arm as the sft / train stage would (0 SFT steps: the start model passed through) and save its model
    folder; returns it and what validation selected (selection_summary)."""
    from vlmgym.rl.stage_setup import (
        check_sft_budget,
        save_model,
        selection_summary,
        stage_policy,
        stage_trainer,
        warm_perception,
    )

    stage = arm_section(arm)
    policy, params = stage_policy(stage, config, sections["model"])
    checkpoints = arm_checkpoints(arm, config, sections)
    summary: dict[str, float] = {"steps": config.steps}
    if checkpoints is not None:
        if stage == "sft":
            check_sft_budget(config, policy, sections["env"])
        if stage == "sft" and config.perception.steps:  # a seed's SFT start, warmed up as the sft stage warms its own
            params, _ = warm_perception(config, policy, params, sections["env"], checkpoints, log=log_metrics)
        callbacks = {"samples_callback": samples_callback} if stage == "train" and samples_callback else {}
        trainer = stage_trainer(stage, config, policy, params, sections["env"], checkpoints,
                                metrics_callback=log_metrics, **callbacks)
        params = trainer.run()
        summary.update(selection_summary(trainer))
    return save_model(config.out_dir, policy, params, config.init_dir, config.lora.dropout), summary


def answer(model_dir: Path, split: str, arm: str, sections: dict[str, Any], blank_images: bool = False) -> list[dict]:
    """Greedy answers of a model folder on a split, as the rollout stage writes them (`blank_images`: every image
    grey, the text-only baseline)."""
    from vlmgym.eval.answering import greedy_answers

    return greedy_answers(model_dir, sections["rollout"], sections["model"], sections["env"], split, arm,
                          blank_images=blank_images)


def sampled_answers(model_dir: Path, split: str, arm: str, sections: dict[str, Any], seed: int) -> list[dict]:
    """`rollout.sampled_answers` answers per prompt of a model folder on a split, sampled with `rollout.sampling`,
    as the rollout stage samples them; the key from rollout.seed, the study's seed and the arm's name, so each run
    draws its own samples and a rerun the same."""
    import zlib

    import jax

    from vlmgym.eval.answering import open_engine, open_env, sampling_engine
    from vlmgym.eval.rollouts import answer_split

    rollout = sections["rollout"]
    engine, params = open_engine(model_dir, rollout, sections["model"])
    env = open_env(sections["env"], rollout, rollout.shards_dir, split, engine.processor.tokenizer, rollout.limit)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(rollout.seed), seed), zlib.crc32(arm.encode()) % 2**31)
    return answer_split(sampling_engine(engine, rollout), params, env, policy=arm, batch_size=rollout.batch_size,
                        group_size=rollout.sampled_answers, key=key)[0]


def available_splits(shards_dir: str) -> list[str]:
    """The held-out splits the shard stage wrote: test, and the env's OOD split when it has one."""
    found = [split for split in SPLITS if (Path(shards_dir) / split).is_dir()]
    if "test" not in found:
        raise FileNotFoundError(f"{shards_dir}/test: no test split; run the pipeline's shard stage (dvc repro shard)")
    return found


def constant_answers(sections: dict[str, Any], splits: list[str]) -> tuple[tuple | None, dict[str, list]]:
    """The constant baseline: (answer, mean reward, split chosen on, candidates tried), chosen on val, and its
    records on every split; (None, {}) when the env has no ideal answer to propose."""
    from vlmgym.eval import answering, blind
    from vlmgym.models.qwen3_vl.processor import Processor

    rollout, env_params = sections["rollout"], sections["env"]
    tokenizer = Processor.from_pretrained(sections["sft"].init_dir).tokenizer  # every start shares the base tokenizer
    chosen = answering.choose_constant(rollout, env_params, rollout.shards_dir, tokenizer)
    if chosen is None:
        return None, {}
    # the held-out splits as the arms answer them (rollout.limit)
    return chosen, {split: blind.constant_records(answering.open_env(env_params, rollout, rollout.shards_dir, split,
                                                                     tokenizer, rollout.limit), chosen[0])
                    for split in splits}
