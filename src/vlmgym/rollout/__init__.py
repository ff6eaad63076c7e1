"""Rollouts: group sampling from Qwen3-VL with one prefill per prompt and a fully jitted decode loop.

    from vlmgym.rollout import RolloutEngine, SamplingSettings
    engine = RolloutEngine(cfg, processor, SamplingSettings(max_new_tokens=64, temperature=1.0, top_k=0,
                                                            top_p=1.0, eos_ids=(im_end, endoftext), pad_id=pad))
    batch = engine.generate(params, obs_list, group_size=8, key=jax.random.key(step))

See engine.py for RolloutBatch's arrays, sampling.py for the sampling method and randomness, decode.py for
the shared-prompt KV cache; `vlmgym bench rollout` (vlmgym.bench.rollout) measures it.
"""

from vlmgym.rollout.engine import TRACE_COUNTS, Buckets, RolloutBatch, RolloutEngine, repeat_prompt_inputs
from vlmgym.rollout.sampling import SamplingSettings, sample_tokens

__all__ = ["TRACE_COUNTS", "Buckets", "RolloutBatch", "RolloutEngine", "SamplingSettings", "repeat_prompt_inputs",
           "sample_tokens"]
