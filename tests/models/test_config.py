"""Config reading (4.57 and 5.x layouts), validation, and the real configs' exact parameter counts."""

from __future__ import annotations

import copy
import json

import jax
import pytest

from vlmgym.models.qwen3_vl.config import CONFIGS_DIR, ConfigError, from_hf_dict, named_config
from vlmgym.models.qwen3_vl.weights import abstract_params, count_params, param_axes

# Exact counts of Qwen3VLForConditionalGeneration built from the same JSON on the meta device (tied head counted once).
EXPECTED = {"2b": (2_127_532_032, 406_957_056), "4b": (4_437_815_808, 415_347_712), "8b": (8_767_123_696, 576_388_336)}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_configs_build_abstractly_with_exact_counts(name):
    cfg = named_config(name)
    shapes = abstract_params(cfg)  # jax.eval_shape: no memory
    total, vision = EXPECTED[name]
    assert count_params(shapes) == total
    assert count_params(shapes["visual"]) == vision
    assert ("lm_head" in shapes) == (name == "8b")
    axes = param_axes(cfg)
    for shape, names in zip(jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))):
        assert len(shape.shape) == len(names)


def _raw_4b():
    return json.loads((CONFIGS_DIR / "qwen3_vl_4b.json").read_text())


def test_457_and_5x_rope_layouts_read_the_same():
    old = _raw_4b()  # hub layout written by 4.57: rope_theta + rope_scaling
    new = copy.deepcopy(old)
    text = new["text_config"]
    text["rope_parameters"] = {**text.pop("rope_scaling"), "rope_theta": text.pop("rope_theta")}
    a, b = from_hf_dict(old), from_hf_dict(new)
    assert a == b
    assert a.text.rope_theta == 5_000_000.0 and a.text.mrope_section == (24, 20, 20)
    assert a.tie_word_embeddings and a.vision.deepstack_visual_indexes == (5, 11, 17)


def test_bad_configs_name_the_problem():
    raw = _raw_4b()
    del raw["text_config"]["hidden_size"]
    with pytest.raises(ConfigError, match="text_config.hidden_size: missing"):
        from_hf_dict(raw)
    raw = _raw_4b()
    raw["text_config"]["rope_scaling"]["mrope_section"] = [24, 20, 24]
    with pytest.raises(ConfigError, match="mrope_section"):
        from_hf_dict(raw)
    raw = _raw_4b()
    raw["text_config"]["rope_scaling"]["rope_type"] = "yarn"
    with pytest.raises(ConfigError, match="yarn"):
        from_hf_dict(raw)
    with pytest.raises(ConfigError, match="unknown dtype"):
        named_config("4b").with_dtypes("fp16")
