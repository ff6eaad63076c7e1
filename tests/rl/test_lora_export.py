"""A LoRA run's model folder through the export: the merged HF checkpoint gives the JAX adapted model's logits in
plain transformers, and its PEFT adapter folder loaded by `peft` onto the HF base gives them too."""

import json

import numpy as np
import pytest
from lora_fixtures import trained_looking_adapters

from vlmgym.models.checkpoint import ExportCheckFailed, check_adapter, export_and_check
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.convert import read_safetensors
from vlmgym.models.qwen3_vl.hf_reference import load_hf_model
from vlmgym.models.qwen3_vl.parity import _hf_side, _jax_side, parity_image
from vlmgym.models.qwen3_vl.processor import Processor
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.stage_setup import folder_identity, save_model
from vlmgym.rollout.sampling import SamplingSettings

TOLERANCE = 1e-5  # fp32, the bound docs/scaling.md states



@pytest.fixture(scope="module")
def exported(tiny_vlm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora_export")
    settings = SamplingSettings(max_new_tokens=8, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id))
    policy = Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings)
    adapted = trained_looking_adapters(tiny_vlm.params, tiny_vlm.cfg)
    jax_dir = save_model(folder / "jax", policy, adapted, tiny_vlm.folder)
    hf_dir, figures = export_and_check(jax_dir, folder / "hf")
    processor = Processor.from_pretrained(tiny_vlm.folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Where is this?"}]}]
    inputs = processor([messages], [[parity_image(1, (64, 64))]])
    jax_logits, _ = _jax_side(tiny_vlm.cfg, adapted, inputs, 0)
    base_logits, _ = _jax_side(tiny_vlm.cfg, tiny_vlm.params, inputs, 0)
    return {"hf_dir": hf_dir, "jax_dir": jax_dir, "figures": figures, "inputs": inputs, "jax": jax_logits,
            "base": base_logits}


def _modules(cfg):
    return 7 * cfg.text.num_hidden_layers + 4 * cfg.vision.depth


def test_merged_export_loads_in_transformers_with_the_adapted_logits(exported, tiny_vlm):
    assert (exported["jax_dir"] / lora.ADAPTER_DIR / lora.PEFT_CONFIG).exists()
    assert exported["figures"]["adapted_modules"] == _modules(tiny_vlm.cfg)
    assert np.abs(exported["jax"] - exported["base"]).max() > 1e-3  # the adapters matter
    hf_logits, _ = _hf_side(load_hf_model(exported["hf_dir"], dtype="fp32"), exported["inputs"], 0)
    valid = exported["inputs"]["attention_mask"].astype(bool)
    assert np.abs(hf_logits - exported["jax"])[valid].max() <= TOLERANCE


def test_peft_loads_the_adapter_onto_the_hf_base_with_the_same_logits(exported, tiny_vlm):
    peft = pytest.importorskip("peft")
    config = json.loads((exported["hf_dir"] / lora.ADAPTER_DIR / lora.PEFT_CONFIG).read_text())
    assert config["base_model_name_or_path"] == str(tiny_vlm.folder) and config["r"] == 4
    base_file = json.loads((exported["hf_dir"] / lora.ADAPTER_DIR / lora.BASE_FILE).read_text())
    assert base_file["identity"] == folder_identity(tiny_vlm.folder)
    base = load_hf_model(tiny_vlm.folder, dtype="fp32")
    model = peft.PeftModel.from_pretrained(base, str(exported["hf_dir"] / lora.ADAPTER_DIR))
    layers = [name for name, _ in model.named_modules() if name.endswith("lora_A")]
    assert len(layers) == _modules(tiny_vlm.cfg)  # the mergers' linear_fc1/fc2 are not adapted
    hf_logits, _ = _hf_side(model, exported["inputs"], 0)
    valid = exported["inputs"]["attention_mask"].astype(bool)
    assert np.abs(hf_logits - exported["jax"])[valid].max() <= TOLERANCE


def test_adapter_check_rejects_a_wrong_shape(exported, tmp_path):
    import shutil

    from safetensors.numpy import save_file

    broken = tmp_path / "hf"
    shutil.copytree(exported["hf_dir"], broken)
    weights = broken / lora.ADAPTER_DIR / lora.PEFT_WEIGHTS
    state = read_safetensors(weights.parent)
    key = next(k for k in state if k.endswith("lora_A.weight"))
    state[key] = state[key][:, :-1].copy()
    save_file(state, str(weights))
    with pytest.raises(ExportCheckFailed, match="do not fit"):
        check_adapter(broken, read_safetensors(broken))
