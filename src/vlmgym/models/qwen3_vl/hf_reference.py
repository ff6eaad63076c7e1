"""transformers' model as the reference the JAX port is compared with: load it, feed it vlmgym's numpy inputs.

The class is the folder's family's (Qwen3VLForConditionalGeneration or Qwen2_5_VLForConditionalGeneration, from its
config.json: vlmgym.models.family); the rest is the same for both.

One loader for everything that runs the HF model next to the JAX one (`vlmgym parity`, the convert stage's parity
check, the export check, the evaluate stage's HF baseline, `vlmgym bench rollout`):

    model = load_hf_model(folder, "fp32")                  # offline, eval mode
    inputs = torch_inputs(model, processor(messages, images))
    logits = hf_logits(model, inputs)                      # (B, L, V) float32 numpy
    tokens = hf_generate(model, inputs, max_new_tokens=8, **GREEDY)
    answers, count, seconds = hf_greedy(model, processor, observations, max_new_tokens=8, batch_size=4)

torch and transformers are imported only when called.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

TORCH_DTYPES = ("fp32", "bf16")
# Greedy decoding, with the checkpoint's sampling defaults (top_k, top_p, temperature) switched off so
# transformers does not warn that they are ignored.
GREEDY = {"do_sample": False, "top_k": None, "top_p": None, "temperature": None}
LOADING_PROBLEMS = ("missing_keys", "unexpected_keys", "mismatched_keys")


class IncompleteCheckpoint(ValueError):
    """transformers loaded the folder but reports missing, unexpected or mismatched weights."""

    def __init__(self, folder: str | Path, problems: dict[str, Any]):
        super().__init__(f"{folder}: transformers reports {problems}")
        self.problems = problems


def torch_dtype(dtype: str) -> Any:
    """The torch dtype of a vlmgym dtype name ('fp32' or 'bf16')."""
    import torch

    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {TORCH_DTYPES}, got {dtype!r}")
    return torch.float32 if dtype == "fp32" else torch.bfloat16


def load_hf_model(hf_dir: str | Path, dtype: str | None = "fp32", device: str = "cpu", strict: bool = False) -> Any:
    """transformers' model of the folder's family from a local folder (offline), on `device`, in eval mode.

    dtype None: transformers' default (the checkpoint's dtype). strict: raise IncompleteCheckpoint when
    transformers reports missing, unexpected or mismatched weights (it would otherwise initialise them randomly).
    """
    from vlmgym.models.family import family_named, folder_family

    model_class = family_named(folder_family(hf_dir)).hf_class()
    kwargs = {} if dtype is None else {"dtype": torch_dtype(dtype)}
    model, info = model_class.from_pretrained(str(hf_dir), local_files_only=True, output_loading_info=True, **kwargs)
    problems = {k: v for k, v in info.items() if v and k in LOADING_PROBLEMS}
    if strict and problems:
        raise IncompleteCheckpoint(hf_dir, problems)
    return model.to(device).eval()


def random_hf_model(config_path: str | Path, dtype: str = "fp32", device: str = "cpu", seed: int = 0) -> Any:
    """transformers' model of the config's family with random weights for a config.json (e.g. a shipped real
    config), in eval mode."""
    import torch

    from vlmgym.models.family import family_named, folder_family

    family = family_named(folder_family(config_path))
    config = family.hf_config_class().from_json_file(str(config_path))
    torch.manual_seed(seed)
    with torch.device(device):
        model = family.hf_class()._from_config(config, dtype=torch_dtype(dtype))
    return model.eval()


def torch_inputs(model: Any, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """vlmgym's processed numpy inputs as the keyword arguments of the HF model's forward / generate.

    Ids and masks become int64, pixels the model's dtype, all on the model's device; the image arrays are left
    out when the batch has no image. transformers computes its own MRoPE positions (`position_ids` is not passed).
    """
    import torch

    def tensor(key: str) -> Any:
        return torch.from_numpy(np.asarray(inputs[key]).astype(np.int64)).to(model.device)

    out = {key: tensor(key) for key in ("input_ids", "attention_mask", "mm_token_type_ids")}
    if np.asarray(inputs["image_grid_thw"]).shape[0]:
        out["image_grid_thw"] = tensor("image_grid_thw")
        out["pixel_values"] = torch.from_numpy(np.asarray(inputs["pixel_values"], np.float32)).to(model.device,
                                                                                                  model.dtype)
    return out


def _forget_rope_deltas(model: Any) -> None:
    # transformers keeps the last call's MRoPE offsets on the model; a stale one would shift the positions.
    model.model.rope_deltas = None


def hf_logits(model: Any, inputs: dict[str, Any]) -> np.ndarray:
    """One forward over `torch_inputs`: the logits (B, L, V) as float32 numpy."""
    import torch

    with torch.no_grad():
        _forget_rope_deltas(model)
        return model(**inputs).logits.float().cpu().numpy()


def hf_generate(model: Any, inputs: dict[str, Any], **generate_kwargs: Any) -> Any:
    """`model.generate` over `torch_inputs` (prompt + new tokens, a torch tensor), without gradients."""
    import torch

    with torch.no_grad():
        _forget_rope_deltas(model)
        return model.generate(**inputs, **generate_kwargs)


def answer_through_eos(tokens: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """The tokens up to and including the first end token (all of them when none ends the answer)."""
    out = []
    for token in tokens:
        out.append(int(token))
        if int(token) in eos_ids:
            break
    return out


def hf_greedy(model: Any, processor: Any, observations: Sequence[dict], *, max_new_tokens: int,
              batch_size: int, warm_up: bool = True) -> tuple[list[list[int]], int, float]:
    """transformers' greedy answers (through the first end token), generated tokens and seconds spent; `warm_up`
    first generates one token untimed, which only matters when the seconds are reported."""
    eos_ids = list(processor.eos_token_ids)
    answers: list[list[int]] = []
    tokens = 0
    seconds = 0.0
    for start in range(0, len(observations), batch_size):
        chunk = observations[start:start + batch_size]
        tools = [o.get("tools") for o in chunk]  # a multi-turn env's first prompt lists its tools, as the engine's
        inputs = processor([o["messages"] for o in chunk], [list(o.get("images") or []) for o in chunk],
                           padding_side="left", **({"batch_of_tools": tools} if any(tools) else {}))
        kwargs = torch_inputs(model, inputs)
        if start == 0 and warm_up:  # warm-up (allocator, kernels), so the timing is of generation, not first-call setup
            hf_generate(model, kwargs, max_new_tokens=1, pad_token_id=int(processor.pad_token_id), **GREEDY)
        started = time.perf_counter()
        out = hf_generate(model, kwargs, max_new_tokens=max_new_tokens, eos_token_id=eos_ids,
                          pad_token_id=int(processor.pad_token_id), **GREEDY)
        seconds += time.perf_counter() - started
        for row in out[:, kwargs["input_ids"].shape[1]:].tolist():
            answer = answer_through_eos(row, eos_ids)
            answers.append(answer)
            tokens += len(answer)
    return answers, tokens, seconds
