"""A random tiny model whose turns end early, so multi-turn tests get later turns (shared by tests/rollout and
tests/rl): its next token is near uniform over the vocabulary, so <|im_end|> alone would almost never end a turn."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from vlmgym.models.qwen3_vl.model import jit_token_logprobs


def ending_turns_early(params: Any, cfg: Any, probe: Any, im_end: int, logit: float) -> Any:
    """`params` with <|im_end|>'s output row pointed along the mean final hidden state of `probe` (a RolloutBatch
    sampled from them), scaled so its logit is about `logit` where a hidden state is near that mean."""
    inputs = jax.tree.map(jax.numpy.asarray, probe.sequence_inputs())
    _, features = jit_token_logprobs(params, cfg, inputs, probe.completion_ids, probe.completion_mask,
                                     with_features=True)
    mean = np.asarray(features).reshape(-1, features.shape[-1]).mean(axis=0)
    row = jax.numpy.asarray(logit * mean / (mean @ mean))
    out = jax.tree.map(lambda x: x, params)
    if cfg.tie_word_embeddings:
        out["text"]["embed"] = out["text"]["embed"].at[im_end].set(row)
    else:
        out["lm_head"]["kernel"] = out["lm_head"]["kernel"].at[:, im_end].set(row)
    return out
