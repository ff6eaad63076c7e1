"""configs/gpu_smoke.yaml: it merges into params.yaml and validates, and the weight-free planner's estimate of its
training steps (GRPO with its sampling call, and SFT) fits one 80 GB GPU.

Compiling the plan for XLA:CPU takes 20-45 s a step on 2 cores, too slow for this module: PLANNED holds what

    vlmgym plan --params configs/gpu_smoke.yaml [--algorithm sft] --json PATH

reported (docs/scaling.md quotes it). The tests recompute every part of it that needs no compile from the preset as
it is now (the shapes `vlmgym plan --params` derives, the bytes of the params with their adapters, of the LoRA
optimizer state, of the merged kernels the rollout samples with and of a micro-batch), so a change to the preset or
the model that moves them fails here until the plan is rerun and PLANNED and docs/scaling.md are updated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "configs" / "gpu_smoke.yaml"
GPU_BYTES = 80 * 10**9  # an 80 GB GPU (A100/H100 80GB): 74.5 GiB

# `vlmgym plan --params configs/gpu_smoke.yaml --json PATH` (train) and the same with `--algorithm sft` (sft), on
# XLA:CPU, jax 0.10.2, 2026-12-06: the shapes planned and bytes per device.
PLANNED: dict[str, dict[str, Any]] = {
    "train": {
        "shapes": {"config": "tiny", "tiny": (2560, 36, 2048), "mesh": (1, 1, 1), "algorithm": "grpo", "batch": 32,
                   "group": 8, "micro_batches": 2, "seq": 98, "image": (192, 256), "answer": 64, "remat": "layer",
                   "lora_rank": 16, "dtype": "bf16", "param_dtype": "bf16"},
        "state": {"params": 5789925488, "opt_state": 224133140, "grads": 112066560, "micro_batch": 2399680,
                  "merged_kernels": 5662310400},
        "peak": {"learner": 19067265792, "rollout": 23820911788, "step": 23820911788},
    },
    "sft": {
        "shapes": {"config": "tiny", "tiny": (2560, 36, 2048), "mesh": (1, 1, 1), "algorithm": "sft", "batch": 8,
                   "group": 1, "micro_batches": 1, "seq": 98, "image": (192, 256), "answer": 64, "remat": "layer",
                   "lora_rank": 16, "dtype": "bf16", "param_dtype": "bf16"},
        "state": {"params": 5789925488, "opt_state": 224133140, "grads": 112066560, "micro_batch": 9539072},
        "peak": {"learner": 19016925296, "step": 19016925296},
    },
}


def merged(folder: Path, *extra: str) -> Path:
    """A copy of the repo's params.yaml with the preset applied by `vlmgym preset` (over the defaults, as its header
    says; `--on-top`: over the file's values)."""
    from vlmgym.cli import main

    folder.mkdir()
    params = folder / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)
    assert main(["preset", str(PRESET), "--params", str(params), *extra]) == 0
    return params


def validated(params: Path, capsys) -> dict[str, Any]:
    """`vlmgym params FILE`: exit 0 and every section, as JSON."""
    from vlmgym.cli import main

    capsys.readouterr()
    assert main(["params", str(params)]) == 0
    return json.loads(capsys.readouterr().out)


def test_preset_merges_over_params_yaml_and_validates(tmp_path, capsys):
    for params in (merged(tmp_path / "over_defaults"), merged(tmp_path / "on_top", "--on-top")):
        sections = validated(params, capsys)
        model, train, sft, data = sections["model"], sections["train"], sections["sft"], sections["data"]
        # offline: the synthetic world and a model built here (no hub access)
        assert data["source"] == "synthetic" and model["source"] == "tiny"
        # Qwen3-VL-4B's text width and depth, bf16 on one device
        assert (model["tiny_hidden_size"], model["tiny_num_layers"]) == (2560, 36)
        assert model["dtype"] == model["param_dtype"] == "bf16" and train["mesh"] == sft["mesh"] == []
        # LoRA with activation checkpointing in both training stages (the 4B LoRA recipe's settings), a few steps
        for stage in (sft, train):
            assert stage["lora"]["rank"] == 16 and stage["remat"] == "layer" and stage["freeze"] == "none"
            assert 1 <= stage["steps"] <= 5
        assert (train["batch_prompts"] * train["group_size"]) % train["micro_batches"] == 0
        # a few hundred synthetic images
        assert 100 <= data["train_images"] + data["test_images"] + data["ood_images"] <= 1000
    text = PRESET.read_text()
    assert "vlmgym preset configs/gpu_smoke.yaml && .venv/bin/dvc repro" in text
    assert "not yet measured on a GPU" in text and "docs/scaling.md" in text


def test_the_planned_steps_fit_an_80_gb_gpu():
    for stage, plan in PLANNED.items():
        assert 0 < plan["peak"]["step"] == max(plan["peak"].values()) < GPU_BYTES, stage
    assert "rollout" in PLANNED["train"]["peak"]  # the GRPO step's sampling call is planned too


def test_the_plan_is_of_the_preset_as_it_is():
    """The shapes `vlmgym plan --params` derives now, and every byte count of the plan that needs no compile, equal
    PLANNED's."""
    import jax

    from vlmgym.models.qwen3_vl import lora
    from vlmgym.plan.cli import parse_args
    from vlmgym.plan.programs import Planner, device_bytes
    from vlmgym.plan.shapes import spec_config

    for stage, plan in PLANNED.items():
        spec, _ = parse_args(["--params", str(PRESET), "--algorithm", "sft" if stage == "sft" else "grpo"])
        assert {field: getattr(spec, field) for field in plan["shapes"]} == plan["shapes"], stage
        planner = Planner(spec_config(spec), spec)
        trained = jax.tree.leaves(jax.tree.map(lambda leaf, t: leaf if t else None, planner.params,
                                               lora.trainable_mask(planner.params)))
        state = {"params": device_bytes(planner.params), "opt_state": device_bytes(planner.opt_state()),
                 "grads": sum(4 * int(leaf.size) for leaf in trained),  # fp32 gradients of the adapters' A and B
                 "micro_batch": device_bytes(planner.micro())}
        if stage == "train":  # the rollout samples with the adapters merged into their kernels
            state["merged_kernels"] = sum(device_bytes(d["kernel"])
                                          for d in lora.adapted_denses(planner.params).values())
        assert state == plan["state"], stage


def test_docs_quote_the_plan():
    scaling = (REPO / "docs" / "scaling.md").read_text()
    assert "vlmgym plan --params configs/gpu_smoke.yaml" in scaling and "configs/gpu_smoke.yaml" in scaling
    for plan in PLANNED.values():
        assert f"{plan['peak']['step'] / 2**30:.2f} GiB" in scaling
    assert "not yet measured on a GPU" in scaling
