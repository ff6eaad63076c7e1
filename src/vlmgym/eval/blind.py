"""Image-blind baselines: what a policy scores without looking at the image, so a report tells whether it does.

Two baselines, each answering the same test (and test_ood) samples as the trained policies:
- `constant`: the best constant answer. Its candidates are the ideal answers (SFT targets) of the val split's
  samples (train's when the shards hold no val split), at most `candidates` of them; the one with the highest mean
  reward on those samples answers every test sample. Chosen on val, never on test.
- `<policy>_blind`: the trained policy itself with every image blanked to mid grey (the same size, so the prompt
  has the same tokens): a text-only policy, which may still read the question.
A policy that uses its image beats both; the evaluate stage reports each trained policy minus each baseline with
paired intervals and warns when the interval does not exclude 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.envs.base import Env, MissingPart
from vlmgym.eval.records import rollout_record
from vlmgym.params import RolloutParams

CONSTANT = "constant"
BLIND_SUFFIX = "_blind"
BLANK_GREY = (128, 128, 128)
HEADLINE = "mean_reward"
# Train samples the constant baseline is chosen on when the shards hold no val split.
CONSTANT_TRAIN_SAMPLES = 256


def blind_name(policy: str) -> str:
    """The policy name of `policy` answering with blanked images."""
    return f"{policy}{BLIND_SUFFIX}"


def baseline_policies(rollout: RolloutParams) -> list[str]:
    """The baseline policies the rollout stage writes for these rollout settings, in report order."""
    return ([CONSTANT] if rollout.constant_baseline else []) + [blind_name(p) for p in rollout.blind_policies]


def blank_observation(observation: Mapping[str, Any]) -> dict[str, Any]:
    """The observation with each image replaced by a uniform grey image of its size."""
    images = [Image.new("RGB", image.size, BLANK_GREY) for image in observation["images"]]
    return {**observation, "images": images}


def candidate_answers(env: Env, limit: int) -> list[str]:
    """Distinct SFT targets of the env's samples, in sample order, at most `limit` (empty: the env has no ideal
    answer, so no constant can be proposed)."""
    seen: dict[str, None] = {}
    for sample in env.samples:
        try:
            seen.setdefault(env.sft_target(dict(sample.meta)), None)
        except MissingPart:
            return []
        if len(seen) >= limit:
            break
    return list(seen)


def best_constant(env: Env, candidates: Sequence[str]) -> tuple[str, float]:
    """(answer, mean reward) of the candidate with the highest mean reward over every sample of `env`; ties go to
    the earlier candidate, so the choice is deterministic."""
    if not candidates:
        raise ValueError(f"{env.name}: no candidate answers for the constant baseline")
    states = [env.reset(i)[0] for i in range(len(env))]
    best, best_reward = candidates[0], float("-inf")
    for answer in candidates:
        reward = sum(env.step_text(state, answer)[2] for state in states) / len(states)
        if reward > best_reward:
            best, best_reward = answer, reward
    return best, best_reward


def constant_split(shards_dir: str) -> str:
    """The split the constant answer is chosen on: val, or train when the shards hold no val split."""
    return "val" if (Path(shards_dir) / "val").is_dir() else "train"


def choose_constant(open_env: Callable[[str, int | None], Any], shards_dir: str,
                    limit: int) -> tuple[str, float, str, int] | None:
    """(answer, mean reward, split chosen on, candidates tried) of the constant baseline: chosen on the val split, or
    on train's first CONSTANT_TRAIN_SAMPLES samples when the shards hold none; `open_env(split, limit)` opens the
    env over a split. None when the env has no ideal answer to propose."""
    split = constant_split(shards_dir)
    chooser = open_env(split, None if split == "val" else CONSTANT_TRAIN_SAMPLES)
    candidates = candidate_answers(chooser, limit)
    if not candidates:
        return None
    answer, reward = best_constant(chooser, candidates)
    return answer, reward, split, len(candidates)


def constant_records(env: Env, answer: str, policy: str = CONSTANT) -> list[dict[str, Any]]:
    """Rollout records of `answer` given to every sample of `env`, scored as a policy's answers are."""
    tokenizer = env.tokenizer
    tokens = [int(t) for t in tokenizer.encode(answer, add_special_tokens=False)] if tokenizer is not None else []
    records = []
    for i in range(len(env)):
        state, _ = env.reset(i)
        _, _, reward, _, info = env.step_text(state, answer)
        record = rollout_record(type(env), state.key, answer, reward, info, state.meta, policy=policy)
        record["tokens"] = tokens
        record["finish_reason"] = "eos"
        records.append(record)
    return records


def blind_comparisons(policies: Sequence[str], baselines: Sequence[str],
                      start_policies: Sequence[str]) -> list[tuple[str, str]]:
    """(trained policy, baseline) pairs: each trained policy against the constant and against itself blanked."""
    pairs = []
    for policy in policies:
        if policy in start_policies or policy in baselines:
            continue
        pairs += [(policy, b) for b in (CONSTANT, blind_name(policy)) if b in baselines]
    return pairs


def blind_check(results: Mapping[str, Mapping[str, float]], pairs: Sequence[tuple[str, str]],
                split: str) -> tuple[dict[str, str], list[str]]:
    """({"<policy> - <baseline> (<split>)": "diff [low, high]"}, warnings) for each pair in `results`: a warning
    where the paired interval of the mean-reward difference does not lie above 0."""
    figures, warnings = {}, []
    for policy, baseline in pairs:
        diff = results.get(f"{policy}_minus_{baseline}")
        if not diff or HEADLINE not in diff:
            continue
        low, high = diff[f"{HEADLINE}_ci_low"], diff[f"{HEADLINE}_ci_high"]
        text = f"{diff[HEADLINE]:+.3f} [{low:+.3f}, {high:+.3f}]"
        figures[f"{policy} - {baseline} ({split})"] = text
        if not low > 0:
            what = "the best constant answer" if baseline == CONSTANT else "itself with its images blanked"
            warnings.append(f"policy {policy!r} does not beat {what} ({baseline!r}) on {split}: mean reward "
                            f"difference {text}; its score does not show that it uses the image")
    return figures, warnings
