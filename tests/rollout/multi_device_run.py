"""Run by test_multi_device.py with two fake CPU devices: the engine split over both vs on one device."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from conftest import _make_obs

from vlmgym.models.qwen3_vl.config import load_hf_config
from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
from vlmgym.models.qwen3_vl.processor import Processor
from vlmgym.rollout.engine import TRACE_COUNTS, RolloutEngine
from vlmgym.rollout.sampling import SamplingSettings


def main(folder: str) -> None:
    assert len(jax.devices()) == 2, jax.devices()
    cfg = load_hf_config(folder)
    params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(folder), cfg))
    processor = Processor.from_pretrained(folder)
    # Three prompts, the second with two images: the split is prompts 0-1 on one device and 2 on the other.
    obs = [_make_obs(0), _make_obs(1, num_images=2), _make_obs(2)]
    # The random model rarely says <|im_end|>: its most frequent tokens are the EOS ids, so rows end at
    # different steps.
    probe = RolloutEngine(cfg, processor, SamplingSettings(max_new_tokens=12, temperature=1.0))
    values, counts = np.unique(probe.generate(params, obs, 4, jax.random.key(3)).completion_ids, return_counts=True)
    eos = tuple(int(v) for v in values[np.argsort(-counts)[:3]])
    report = {}
    for name, extra in (("sampled", dict(temperature=1.0, top_k=50, top_p=0.9)), ("greedy", dict(greedy=True))):
        settings = SamplingSettings(max_new_tokens=12, eos_ids=eos, pad_id=int(processor.pad_token_id), **extra)
        one = RolloutEngine(cfg, processor, settings).generate(params, obs, 4, jax.random.key(3))
        split = RolloutEngine(cfg, processor, settings, devices=jax.devices())
        two = split.generate(params, obs, 4, jax.random.key(3))
        traces = sum(TRACE_COUNTS.values())
        again = split.generate(params, obs, 4, jax.random.key(3))
        report[name] = {
            "tokens_equal": bool(np.array_equal(one.completion_ids, two.completion_ids)),
            "again_equal": bool(np.array_equal(two.completion_ids, again.completion_ids)),
            "mask_equal": bool(np.array_equal(one.completion_mask, two.completion_mask)),
            "finish_equal": one.finish_reasons == two.finish_reasons,
            "texts_equal": one.texts == two.texts,
            "logprob_diff": float(np.abs(one.logprobs - two.logprobs).max()),
            "sample_logprob_diff": float(np.abs(one.sample_logprobs - two.sample_logprobs).max()),
            "ended_by_eos": sum(reason == "eos" for reason in two.finish_reasons),
            "devices_used": sorted(str(d) for d in split._replicas),
            "new_traces_on_second_call": sum(TRACE_COUNTS.values()) - traces,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
