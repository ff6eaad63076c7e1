"""`vlmgym bench episodes`: what prefilling a multi-turn episode's whole conversation again costs, turn by turn.

    vlmgym bench episodes [--model DIR] [--prompts 8] [--group 4] [--max-new-tokens 32] [--repeats 3] [--list-tools]

Two-turn digits episodes with the zoom tool (as configs/zoom.yaml sets it: the tool's schema not listed in the
system turn unless --list-tools), on the pipeline's tiny default model (or --model): turn 0 samples
`--group` answers to each of `--prompts` images; every episode then calls zoom (the benchmark writes the call, so each
one goes on whatever the model sampled) and samples its second turn from a prompt holding the whole conversation,
prefilled from scratch as vlmgym.rollout.episodes does. Prints one JSON object: per turn, its prefill and decode
seconds (best of --repeats after a compile) and prompt tokens; `repeated_share`, the part of turn 1's prompt that turn
0's prompt and answer already held (what extending turn 0's KV cache instead would not prefill again); and
`reprefill_saving_bound` = turn 1's prefill seconds x repeated_share / the episode's seconds: the most of an
episode's time that extending the cache could save (prefill time taken as proportional to prompt tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.bench.common import build_default_model

ZOOM = {"x1": 0, "y1": 0, "x2": 500, "y2": 500}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vlmgym bench episodes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="HF Qwen3-VL folder (default: build the tiny default model)")
    parser.add_argument("--prompts", type=int, default=8, help="images (the default train.batch_prompts)")
    parser.add_argument("--group", type=int, default=4, help="episodes per image (group_size)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens each turn decodes (no EOS)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each turn (best is reported)")
    parser.add_argument("--list-tools", action="store_true",
                        help="list the tool's JSON schema in the system turn (env.<name>.list_tools)")
    args = parser.parse_args(argv)
    if min(args.prompts, args.group, args.max_new_tokens, args.repeats) < 1:
        parser.error("--prompts, --group, --max-new-tokens and --repeats must be >= 1")
    return args


def _best(run: Any, repeats: int) -> tuple[Any, dict[str, float]]:
    """The batch of a first (compiling) run and the best timings of `repeats` more."""
    batch = run()
    timings = [run().timings for _ in range(repeats)]
    best = min(timings, key=lambda t: t["total_s"])
    return batch, {"prefill_s": best["prefill_s"], "decode_s": best["decode_s"], "total_s": best["total_s"]}


def _prompt_rows(inputs: dict[str, np.ndarray]) -> list[list[int]]:
    """Each left-padded prompt row's token ids without its padding."""
    return [row[mask > 0].tolist() for row, mask in zip(inputs["input_ids"], inputs["attention_mask"])]


def measure(model_dir: Path, prompts: int, group: int, max_new_tokens: int, repeats: int,
            list_tools: bool) -> dict[str, Any]:
    """The JSON object of the module doc."""
    # here, not at the top: `vlmgym bench episodes --help` starts without JAX
    import jax
    import jax.numpy as jnp

    from vlmgym.envs.digits import DigitsEnv
    from vlmgym.envs.digits.env import DigitsParams
    from vlmgym.envs.multiturn import call_text
    from vlmgym.models.qwen3_vl.chat import END_OF_TURN
    from vlmgym.models.qwen3_vl.config import load_hf_config
    from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
    from vlmgym.models.qwen3_vl.processor import Processor
    from vlmgym.rollout.engine import RolloutEngine
    from vlmgym.rollout.sampling import SamplingSettings

    cfg = load_hf_config(model_dir)
    processor = Processor.from_pretrained(model_dir)
    params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(model_dir), cfg))
    settings = SamplingSettings(max_new_tokens=max_new_tokens, eos_ids=(), pad_id=int(processor.pad_token_id))
    engine = RolloutEngine(cfg, processor, settings)
    zoom = DigitsParams(tools=("zoom",), max_turns=2, list_tools=list_tools)
    env = DigitsEnv(samples=DigitsEnv.generate(prompts, seed=0), params=zoom, tokenizer=processor.tokenizer)
    resets = [env.reset(i) for i in range(prompts)]
    key = jax.random.key(0)
    first_inputs = engine.prepare([obs for _, obs in resets])
    _, first_time = _best(lambda: engine.generate_from_inputs(params, first_inputs, group, key), repeats)
    call = call_text("zoom", ZOOM)
    replies = []
    for state, _ in resets:
        _, reply, _, done, _ = env.step_text(state, call)
        if done or not reply:
            raise RuntimeError(f"the zoom call {call!r} did not go on to a second turn")
        replies.extend([reply] * group)
    second_inputs = engine.prepare(replies)
    _, second_time = _best(lambda: engine.generate_from_inputs(params, second_inputs, 1, jax.random.fold_in(key, 1)),
                           repeats)
    # what turn 0 already computed for each episode: its prompt, then the assistant turn (the call and its end)
    answer = processor.tokenizer.encode(call + END_OF_TURN, add_special_tokens=False)
    earlier = [row + answer for row in _prompt_rows(first_inputs) for _ in range(group)]
    later = _prompt_rows(second_inputs)
    repeated = sum(len(os.path.commonprefix([a, b])) for a, b in zip(earlier, later))
    share = repeated / sum(len(row) for row in later)
    episode_s = first_time["total_s"] + second_time["total_s"]
    return {
        "episodes": prompts * group, "max_new_tokens": max_new_tokens, "list_tools": list_tools,
        "turn_0": {**first_time, "prompt_tokens_mean": float(np.mean([len(r) for r in _prompt_rows(first_inputs)]))},
        "turn_1": {**second_time, "prompt_tokens_mean": float(np.mean([len(r) for r in later]))},
        "repeated_share": share,
        "reprefill_share": second_time["prefill_s"] / episode_s,
        "reprefill_saving_bound": second_time["prefill_s"] * share / episode_s,
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-episodes-") as workdir:
        if args.model:
            model_dir = Path(args.model)
        else:
            model_dir = build_default_model(Path(workdir) / "tiny-default")
        out = measure(model_dir, args.prompts, args.group, args.max_new_tokens, args.repeats, args.list_tools)
    out.update(model=args.model or "tiny default", cores=len(os.sched_getaffinity(0)),
               wall_s=round(time.perf_counter() - started, 1))
    print(json.dumps(out, indent=2))
    return 0
