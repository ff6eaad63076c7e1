"""How far a policy moved from the generalist on the new skill's prompts: a Monte Carlo estimate of the KL divergence
from the policy's own samples, in both directions.

    policy_to_generalist = E_x E_{y ~ pi(.|x)} [log pi(y|x) - log pi_gen(y|x)]  = KL(pi || pi_gen)
    generalist_to_policy = E_x E_{y ~ pi_gen(.|x)} [log pi_gen(y|x) - log pi(y|x)]  = KL(pi_gen || pi)

x runs over the new skill's test prompts (rollout.limit of them), y over `answers` completions per prompt sampled at
temperature 1 with no top-k or top-p (the policy itself, not a sharpened one), up to rollout.max_new_tokens
tokens (the end-of-turn token included when sampled): so each is the KL of the answer distributions truncated at
that length. log pi(y|x) is the sum of the completion's token log-probs, both models scored by the same
teacher-forced learner forward, so the generalist against itself is exactly 0. Each estimate is unbiased and
>= 0 only in expectation: a single sample's log-ratio can be negative. Its standard error is over prompts (the
mean of each prompt's answers), which are independent draws where a prompt's answers are not.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np

DIRECTIONS = {"policy_to_generalist": "KL(pi || pi_gen): y sampled from the policy",
              "generalist_to_policy": "KL(pi_gen || pi): y sampled from the generalist"}


def _key(seed: int, *names: str) -> Any:
    import jax

    key = jax.random.key(seed)
    for name in names:
        key = jax.random.fold_in(key, zlib.crc32(name.encode()) % 2**31)
    return key


def log_ratios(policy: Any, sampler: Any, other: Any, observations: list[dict], answers: int,
               key: Any) -> np.ndarray:
    """Per prompt, the mean over `answers` completions sampled from params `sampler` of log p_sampler(y|x) -
    log p_other(y|x), both summed over the completion's tokens by `policy`'s learner forward at temperature 1."""
    samples = policy.sample(sampler, observations, answers, key)
    batch = policy.build_batch(observations, samples.tokens, samples.mask)
    mask = np.asarray(batch["completion_mask"])
    own = np.asarray(policy.logprobs(sampler, batch))
    # the same params object: the same forward, so a policy against itself is exactly 0, not rounding noise
    theirs = own if other is sampler else np.asarray(policy.logprobs(other, batch))
    per_answer = ((own - theirs) * mask).sum(axis=1, dtype=np.float64)
    return per_answer.reshape(len(observations), answers).mean(axis=1)


def estimate(model_dir: str | Path, generalist_dir: str | Path, sections: dict[str, Any], answers: int,
             seed: int, name: str) -> dict[str, Any]:
    """Both directions' estimates (module docstring) of the policy in `model_dir` against the generalist in
    `generalist_dir` on the test prompts of `sections`' env (the new skill's sections), with their standard errors
    over prompts; seeded by rollout.seed, the study seed and the run's `name`. The same folder: exactly 0."""
    from vlmgym.eval.answering import open_env
    from vlmgym.rl.stage_setup import load_policy

    rollout, model = sections["rollout"], sections["model"]
    if answers < 1:
        raise ValueError(f"KL estimate: answers per prompt must be >= 1, got {answers} (rollout.sampled_answers)")
    policy, params = load_policy(model_dir, model, rollout.max_new_tokens)  # temperature 1, no top-k / top-p
    same = Path(model_dir).resolve() == Path(generalist_dir).resolve()
    generalist = params if same else load_policy(generalist_dir, model, rollout.max_new_tokens)[1]
    env = open_env(sections["env"], rollout, rollout.shards_dir, "test", policy.processor.tokenizer, rollout.limit)
    if env.max_turns > 1:
        raise ValueError(f"KL estimate: env {env.name!r} runs episodes of {env.max_turns} turns; the estimate scores "
                         "one-turn answers (set its tools: [] and max_turns: 1 for the new skill)")
    observations = [env.reset(index)[1] for index in range(len(env))]
    out: dict[str, Any] = {"answers_per_prompt": answers, "prompts": len(observations),
                           "max_new_tokens": rollout.max_new_tokens, "directions": dict(DIRECTIONS)}
    for direction in DIRECTIONS:
        sampler, other = (params, generalist) if direction == "policy_to_generalist" else (generalist, params)
        per_prompt = []
        for start in range(0, len(observations), rollout.batch_size):
            key = _key(rollout.seed, str(seed), name, direction, str(start))
            per_prompt.append(log_ratios(policy, sampler, other, observations[start:start + rollout.batch_size],
                                         answers, key))
        values = np.concatenate(per_prompt)
        spread = float(values.std(ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else math.nan
        out[direction] = float(values.mean())
        out[f"{direction}_se"] = spread
    return out
