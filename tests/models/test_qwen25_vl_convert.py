"""Qwen2.5-VL config reading (4.x flat and 5.x nested layouts, family from config.json) and the strict,
bit-exact HF <-> JAX weight conversion."""

from __future__ import annotations

import copy
import json

import ml_dtypes
import numpy as np
import pytest
from qwen25_fixtures import build_hf_model

from vlmgym.models.family import load_config, model_family
from vlmgym.models.qwen2_5_vl.config import ConfigError, from_hf_dict
from vlmgym.models.qwen2_5_vl.convert import ConversionError, hf_to_params, load_hf_folder, params_to_hf, save_hf_folder
from vlmgym.models.qwen3_vl.convert import read_safetensors

# The layout transformers 4.x wrote for the Qwen2.5-VL 3B hub checkpoint: text keys at the top level.
HUB_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 128000, "num_attention_heads": 16,
    "num_hidden_layers": 36, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
}


def test_hub_layout_config():
    cfg = from_hf_dict(HUB_3B)
    t, v = cfg.text, cfg.vision
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (
        2048, 36, 16, 2, 128)
    assert t.mrope_section == (16, 24, 24) and not t.mrope_interleaved and t.rope_theta == 1e6
    assert cfg.tie_word_embeddings
    assert (v.depth, v.hidden_size, v.window_size, v.window_merged, v.fullatt_block_indexes) == (
        32, 1280, 112, 4, (7, 15, 23, 31))


def test_nested_layout_written_by_transformers_reads_the_same():
    from transformers import Qwen2_5_VLConfig

    nested = Qwen2_5_VLConfig(**copy.deepcopy(HUB_3B)).to_dict()
    assert "text_config" in nested
    assert from_hf_dict(nested) == from_hf_dict(HUB_3B)


def test_family_from_model_type_or_architectures(tmp_path):
    assert model_family(HUB_3B) == "qwen2_5_vl"
    assert model_family({"architectures": ["Qwen2_5_VLForConditionalGeneration"]}) == "qwen2_5_vl"
    assert model_family({"model_type": "qwen3_vl"}) == "qwen3_vl"
    with pytest.raises(ValueError, match="not a supported family"):
        model_family({"model_type": "llava"})
    (tmp_path / "config.json").write_text(json.dumps(HUB_3B))
    assert load_config(tmp_path) == from_hf_dict(HUB_3B)


def test_config_errors():
    with pytest.raises(ConfigError, match="model_type"):
        from_hf_dict({**HUB_3B, "model_type": "qwen3_vl"})
    with pytest.raises(ConfigError, match="mrope_section"):
        from_hf_dict({**HUB_3B, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 23]}})
    with pytest.raises(ConfigError, match="use_sliding_window"):
        from_hf_dict({**HUB_3B, "use_sliding_window": True})


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def saved(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("q25")
    model = build_hf_model(request.param, (1,), 2, seed=7)
    model.save_pretrained(folder)
    return model, folder


def test_round_trip_is_bit_exact(saved):
    _, folder = saved
    state = read_safetensors(folder)
    cfg, params = load_hf_folder(folder)
    back = params_to_hf(params, cfg)
    assert sorted(back) == sorted(state)
    for key, value in state.items():
        assert back[key].dtype == value.dtype and np.array_equal(back[key], value), key


def test_bf16_round_trip_is_bit_exact(saved):
    _, folder = saved
    cfg, params = load_hf_folder(folder)
    state = {k: v.astype(ml_dtypes.bfloat16) for k, v in params_to_hf(params, cfg).items()}
    back = params_to_hf(hf_to_params(state, cfg), cfg)
    assert all(back[k].dtype == ml_dtypes.bfloat16 and np.array_equal(back[k], v) for k, v in state.items())


def test_in_memory_layout_converts_to_the_same_params(saved):
    model, folder = saved
    cfg, params = load_hf_folder(folder)
    in_memory = {k: v.numpy() for k, v in model.state_dict().items()}
    assert any(k.startswith("model.language_model.") for k in in_memory)
    if cfg.tie_word_embeddings:
        in_memory.pop("lm_head.weight")  # the tied head: accepted only when equal to the embedding, so drop it
    converted = hf_to_params(in_memory, cfg)
    import jax

    assert jax.tree.all(jax.tree.map(np.array_equal, converted, params))


def test_exported_folder_loads_in_transformers(saved, tmp_path):
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    model, folder = saved
    cfg, params = load_hf_folder(folder)
    out = save_hf_folder(tmp_path / "export", cfg, params, json.loads((folder / "config.json").read_text()))
    loaded = Qwen2_5_VLForConditionalGeneration.from_pretrained(out).eval()
    original = model.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, original[key]), key


def test_strict_about_keys_and_shapes(saved):
    _, folder = saved
    state = read_safetensors(folder)
    cfg, _ = load_hf_folder(folder)
    with pytest.raises(ConversionError, match="unexpected key 'visual.blocks.0.attn.extra.weight'"):
        hf_to_params({**state, "visual.blocks.0.attn.extra.weight": np.zeros(1, np.float32)}, cfg)
    missing = dict(state)
    missing.pop("model.layers.0.self_attn.q_proj.bias")
    with pytest.raises(ConversionError, match="missing key 'language_model.layers.0.self_attn.q_proj.bias'"):
        hf_to_params(missing, cfg)
    bad = {**state, "visual.merger.ln_q.weight": np.zeros(3, np.float32)}
    with pytest.raises(ConversionError, match="visual.merger.ln_q.weight"):
        hf_to_params(bad, cfg)
    both = {**state, "model.visual.merger.ln_q.weight": state["visual.merger.ln_q.weight"]}
    with pytest.raises(ConversionError, match="appears twice"):
        hf_to_params(both, cfg)


def test_a_written_tied_head_must_equal_the_embedding(saved):
    _, folder = saved
    state = read_safetensors(folder)
    cfg, params = load_hf_folder(folder)
    if not cfg.tie_word_embeddings:
        pytest.skip("untied: lm_head.weight is a tensor of its own")
    embedding = state["model.embed_tokens.weight"]
    import jax

    same = hf_to_params({**state, "lm_head.weight": embedding.copy()}, cfg)
    assert jax.tree.all(jax.tree.map(np.array_equal, same, params))
    with pytest.raises(ConversionError, match="tie_word_embeddings"):
        hf_to_params({**state, "lm_head.weight": embedding + 1}, cfg)
