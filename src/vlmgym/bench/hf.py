"""The transformers side of `vlmgym bench rollout`: HF `generate` on the same prompts, timed.

Runs in its own process (see `rollout.py`) so its peak memory and thread pools do not mix with JAX's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from vlmgym.bench.common import peak_memory_bytes, sampling_from_args
from vlmgym.models.qwen3_vl.hf_reference import hf_generate, load_hf_model, random_hf_model, torch_inputs


def _load_model(args: dict[str, Any], device: str) -> Any:
    """The HF model: from the folder, or random weights for a named real config (GPU benchmark)."""
    if args.get("random_config"):
        return random_hf_model(args["random_config"], args["dtype"], device, seed=0)
    return load_hf_model(args["model_dir"], args["dtype"], device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _thread_counts(device: str) -> list[int]:
    """torch intra-op thread counts to try: the default and, on a multi-core CPU, one."""
    import torch

    default = torch.get_num_threads()
    return [default] if device != "cpu" or default == 1 else [default, 1]


def run(args: dict[str, Any], inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Greedy outputs (for the parity check) and sampled-group throughput of HF generate."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = _load_model(args, device)
    batch = torch_inputs(model, inputs)
    sampling = sampling_from_args(args)
    group_size, new_tokens = int(args["group_size"]), int(args["max_new_tokens"])
    pad_id = int(args["pad_id"])
    result: dict[str, Any] = {}
    if args.get("check_greedy"):
        greedy = hf_generate(model, batch, do_sample=False, max_new_tokens=new_tokens,
                             eos_token_id=list(args["eos_ids"]), pad_token_id=pad_id)
        result["greedy_tokens"] = greedy[:, batch["input_ids"].shape[1]:].cpu().numpy().tolist()
    # Throughput: every sequence runs the full max_new_tokens (no EOS), as in the JAX measurement.
    model.generation_config.eos_token_id = None
    sample_kwargs = dict(do_sample=True, num_return_sequences=group_size, temperature=sampling.temperature,
                         top_k=sampling.top_k, top_p=sampling.top_p, pad_token_id=pad_id)
    by_threads: dict[int, list[float]] = {}
    first_token = []
    # On a CPU shared with other work torch's spinning thread pool can be several times slower than one
    # thread, so each thread count is measured and HF is credited with its best.
    for threads in _thread_counts(device):
        torch.set_num_threads(threads)
        hf_generate(model, batch, max_new_tokens=2, **sample_kwargs)  # warm-up (allocator, kernels)
        _sync(device)
        start = time.perf_counter()
        hf_generate(model, batch, max_new_tokens=1, **sample_kwargs)
        _sync(device)
        first_token.append(time.perf_counter() - start)
        times = by_threads.setdefault(threads, [])
        for _ in range(int(args["repeats"])):
            start = time.perf_counter()
            out = hf_generate(model, batch, max_new_tokens=new_tokens, **sample_kwargs)
            _sync(device)
            times.append(time.perf_counter() - start)
    generated = int(out.shape[0]) * (int(out.shape[1]) - int(batch["input_ids"].shape[1]))
    best_threads = min(by_threads, key=lambda n: min(by_threads[n]))
    times = by_threads[best_threads]
    result["time_to_first_token_s"] = min(first_token)
    result["torch_threads"] = best_threads
    result["tokens_per_s_by_threads"] = {str(n): generated / min(t) for n, t in by_threads.items()}
    best = min(times)
    result.update({
        "generated_tokens": generated,
        "seconds": best,
        "seconds_all": times,
        "tokens_per_s": generated / best,
        "peak_memory_bytes": peak_memory_bytes("torch" if device == "cuda" else None),
        "device": device,
    })
    return result
