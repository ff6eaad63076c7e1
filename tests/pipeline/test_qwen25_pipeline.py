"""A tiny Qwen2.5-VL through the whole micro pipeline (`model.tiny_family: qwen2_5_vl`, one `dvc repro`): every stage
reads the family from the checkpoint's config.json, the export loads in transformers as
Qwen2_5_VLForConditionalGeneration with the JAX model's logits, and evaluate's HF agreement holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run
from shared_setup import shared_across_workers

TOLERANCE = 1e-4  # fp32 logits, as the Qwen2.5-VL parity tests and the convert stage


@pytest.fixture(scope="module")
def qwen25_pipeline(tmp_path_factory):
    def build(folder):
        root, env, output = env_pipeline(folder, {"model": {"tiny_family": "qwen2_5_vl"}})
        return {"root": str(root), "env": env, "output": output}

    built = shared_across_workers(tmp_path_factory, "qwen25-pipeline", build)
    return Path(built["root"]), built["output"]


def test_every_stage_ran_on_a_qwen25_checkpoint(qwen25_pipeline):
    from vlmgym.models.family import folder_family, load_config

    root, output = qwen25_pipeline
    assert stages_run(output) == STAGES
    for folder in ("models/hf/base", "models/jax/base", "models/jax/sft", "models/jax/grpo", "models/hf/grpo"):
        assert folder_family(root / folder) == "qwen2_5_vl", folder
    cfg = load_config(root / "models/jax/grpo")
    assert (cfg.family, cfg.vision.patch_size, cfg.text.mrope_interleaved) == ("qwen2_5_vl", 14, False)
    preprocessor = json.loads((root / "models/hf/base/preprocessor_config.json").read_text())
    assert preprocessor["patch_size"] == 14 and preprocessor["image_mean"][0] == pytest.approx(0.48145466)
    records = read_records(root / "outputs" / "rollouts" / "grpo.jsonl")
    assert len(records) == 16 and all(0 <= r["reward"] <= 1 for r in records)


def test_the_export_loads_as_qwen25_with_the_jax_models_logits(qwen25_pipeline):
    import jax.numpy as jnp
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vlmgym.models.checkpoint import load_checkpoint
    from vlmgym.models.family import encode_images
    from vlmgym.models.qwen3_vl import model as decoder
    from vlmgym.models.qwen3_vl.hf_reference import hf_logits, torch_inputs
    from vlmgym.models.qwen3_vl.parity import parity_image
    from vlmgym.models.qwen3_vl.processor import Processor

    root, _ = qwen25_pipeline
    exported = root / "models/hf/grpo"
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(exported, local_files_only=True,
                                                               dtype=torch.float32).eval()
    processor = Processor.from_pretrained(exported)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Where is this?"}]}]
    assert processor.render(messages).startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    inputs = processor([messages], [[parity_image()]])
    reference = hf_logits(model, torch_inputs(model, inputs))

    cfg, params = load_checkpoint(root / "models/jax/grpo")
    image_embeds, deepstack = encode_images(params, cfg, jnp.asarray(inputs["pixel_values"]), inputs["image_grid_thw"])
    assert deepstack is None
    logits = np.asarray(decoder.jit_forward(params, cfg, jnp.asarray(inputs["input_ids"]),
                                            jnp.asarray(inputs["attention_mask"]), jnp.asarray(inputs["position_ids"]),
                                            image_embeds, None))
    assert np.abs(reference).max() > 0.1  # the check must see real logits
    assert float(np.abs(reference - logits).max()) < TOLERANCE


def test_evaluates_hf_agreement_on_the_qwen25_export(qwen25_pipeline):
    root, _ = qwen25_pipeline
    hf = json.loads((root / "metrics" / "eval.json").read_text())["hf_baseline"]
    assert hf["greedy_token_agreement"] == 1.0 and hf["greedy_exact_match"] == 1.0
    assert hf["max_abs_logit_diff"] < TOLERANCE and hf["logit_samples"] >= 1
