"""The shipped Qwen2.5-VL 3B / 7B configs: exact parameter counts, and every tensor's name and shape equal to
transformers' Qwen2_5_VLForConditionalGeneration built from the same JSON on the meta device."""

from __future__ import annotations

import json

import jax
import pytest

from vlmgym.models.qwen2_5_vl.config import CONFIGS_DIR, ConfigError, named_config
from vlmgym.models.qwen2_5_vl.convert import _hub, key_table
from vlmgym.models.qwen2_5_vl.weights import abstract_params, param_axes
from vlmgym.models.qwen3_vl.weights import count_params

# (total, vision) of Qwen2_5_VLForConditionalGeneration on the meta device (tied head counted once).
EXPECTED = {"3b": (3_754_622_976, 668_684_288), "7b": (8_292_166_656, 676_550_144)}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_configs_build_abstractly_with_exact_counts(name):
    cfg = named_config(name)
    shapes = abstract_params(cfg)
    total, vision = EXPECTED[name]
    assert count_params(shapes) == total
    assert count_params(shapes["visual"]) == vision
    assert ("lm_head" in shapes) == (name == "7b")
    axes = param_axes(cfg)
    for shape, names in zip(jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))):
        assert len(shape.shape) == len(names)


def test_published_dimensions():
    small, large = named_config("3b"), named_config("7b")
    assert (small.text.hidden_size, small.text.num_hidden_layers, small.text.num_attention_heads,
            small.text.num_key_value_heads, small.text.intermediate_size, small.tie_word_embeddings) == (
        2048, 36, 16, 2, 11008, True)
    assert (large.text.hidden_size, large.text.num_hidden_layers, large.text.num_attention_heads,
            large.text.num_key_value_heads, large.text.intermediate_size, large.tie_word_embeddings) == (
        3584, 28, 28, 4, 18944, False)
    for cfg in (small, large):
        v = cfg.vision
        assert (v.depth, v.hidden_size, v.num_heads, v.intermediate_size, v.window_size, v.fullatt_block_indexes,
                v.out_hidden_size) == (32, 1280, 16, 3420, 112, (7, 15, 23, 31), cfg.text.hidden_size)
    with pytest.raises(ConfigError, match="unknown config"):
        named_config("72b")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_tensor_matches_transformers_on_the_meta_device(name):
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    raw = json.loads((CONFIGS_DIR / f"qwen2_5_vl_{name}.json").read_text())
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**raw))
    hf = {key: tuple(p.shape) for key, p in model.named_parameters()}  # tied head listed once (as the embedding)
    hub = {k.replace("model.visual.", "visual.").replace("model.language_model.", "model."): s for k, s in hf.items()}
    assert sum(torch.Size(s).numel() for s in hub.values()) == EXPECTED[name][0]
    cfg = named_config(name)
    shapes = abstract_params(cfg)
    ours = {}
    for key, path, index, kind in key_table(cfg):
        leaf = shapes
        for part in path:
            leaf = leaf[part]
        shape = leaf.shape[1:] if index is not None else leaf.shape
        if kind == "linear":
            shape = shape[::-1]
        elif kind == "patch":
            v = cfg.vision
            shape = (shape[1], v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
        ours[_hub(key)] = tuple(shape)
    assert ours == hub
