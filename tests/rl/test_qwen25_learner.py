"""The learner on a tiny Qwen2.5-VL (the family read from its config.json): completion log-probs equal transformers'
log-softmax, whether each prompt runs once for its group (shared prefix) or once per completion, with or without
remat; LoRA adapters (vision blocks' gated MLP included) export as a merged Qwen2_5_VLForConditionalGeneration and as
a PEFT adapter that `peft` loads onto the HF base, both with the JAX adapted logits; and a 2x2 mesh of fake devices
gives the single-device log-probs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_fixtures import trained_looking_adapters

from vlmgym.models.checkpoint import convert_hf_to_jax, export_and_check, load_checkpoint
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.hf_reference import load_hf_model, torch_inputs
from vlmgym.models.qwen3_vl.parity import _hf_side, _jax_side, parity_image
from vlmgym.models.qwen3_vl.processor import Processor
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rl.stage_setup import save_model
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # fp32 log-probs and logits, as the Qwen3-VL learner and LoRA export tests
GROUP = 2
MESSAGES = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Where is this?"}]}],
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which country?"}]}]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny

    root = tmp_path_factory.mktemp("qwen25_learner")
    corpus = ["Where is this?", "Which country?", "country: France region: Brittany city: Brest"] * 4
    build_tiny(root / "hf", corpus, seed=5, dims=TinyDims.scaled(hidden_size=64, num_layers=2), vocab_size=400,
               family="qwen2_5_vl")
    convert_hf_to_jax(root / "hf", root / "jax")
    cfg, params = load_checkpoint(root / "jax")
    processor = Processor.from_pretrained(root / "hf")
    settings = SamplingSettings(max_new_tokens=6, eos_ids=tuple(processor.eos_token_ids),
                                pad_id=int(processor.pad_token_id))
    return {"root": root, "cfg": cfg, "params": params, "processor": processor, "settings": settings}


def _observations():
    return [{"messages": m, "images": [parity_image(i, (96, 84))]} for i, m in enumerate(MESSAGES)]


def _completions(tiny) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(20, 250, (len(MESSAGES) * GROUP, tiny["settings"].max_new_tokens)).astype(np.int32)
    mask = np.ones(tokens.shape, np.float32)
    mask[1, 4:] = 0  # a completion that ended early
    return tokens, mask


def _hf_logprobs(tiny, completions: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """transformers' log-softmax of each completion token after its prompt (one row per completion)."""
    import torch

    model = load_hf_model(tiny["root"] / "hf", "fp32")
    out = np.zeros(completions.shape, np.float32)
    for row, tokens in enumerate(completions):
        obs = _observations()[row // GROUP]
        inputs = tiny["processor"]([obs["messages"]], [obs["images"]])
        ids = np.concatenate([inputs["input_ids"], tokens[None]], axis=1)
        full = {**inputs, "input_ids": ids, "attention_mask": np.ones_like(ids),
                "mm_token_type_ids": (ids == tiny["processor"].image_token_id).astype(np.int32)}
        with torch.no_grad():
            model.model.rope_deltas = None
            logits = model(**torch_inputs(model, full)).logits.float()
        logprobs = torch.log_softmax(logits[0, inputs["input_ids"].shape[1] - 1:-1], dim=-1).numpy()
        out[row] = logprobs[np.arange(len(tokens)), tokens] * mask[row]
    return out


@pytest.mark.parametrize("share_prefix", [True, False])
def test_learner_logprobs_equal_transformers(tiny, share_prefix):
    policy = Qwen3VLPolicy(tiny["cfg"], tiny["processor"], tiny["settings"], share_prefix=share_prefix)
    completions, mask = _completions(tiny)
    batch = policy.build_batch(_observations(), completions, mask)
    assert (batch["inputs"]["input_ids"].shape[0] == len(MESSAGES)) == share_prefix
    got = np.asarray(policy.logprobs(tiny["params"], batch))
    np.testing.assert_allclose(got, _hf_logprobs(tiny, completions, mask), atol=TOLERANCE, rtol=0)


def test_remat_gives_the_same_gradients(tiny):
    completions, mask = _completions(tiny)
    grads = []
    for remat in ("none", "layer"):
        policy = Qwen3VLPolicy(tiny["cfg"], tiny["processor"], tiny["settings"], remat=remat)
        batch = policy.build_batch(_observations(), completions, mask)
        grads.append(jax.grad(lambda p, b=batch, pol=policy: pol.logprobs(p, b).sum())(tiny["params"]))
    assert float(jnp.abs(grads[0]["visual"]["blocks"]["gate"]["kernel"]).max()) > 0  # the vision tower learns
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)



@pytest.fixture(scope="module")
def exported(tiny):
    policy = Qwen3VLPolicy(tiny["cfg"], tiny["processor"], tiny["settings"])
    adapted = trained_looking_adapters(tiny["params"], tiny["cfg"])
    jax_dir = save_model(tiny["root"] / "lora_jax", policy, adapted, tiny["root"] / "jax")
    hf_dir, figures = export_and_check(jax_dir, tiny["root"] / "lora_hf")
    inputs = tiny["processor"]([MESSAGES[0]], [[parity_image(1, (96, 84))]])
    jax_logits, _ = _jax_side(tiny["cfg"], adapted, inputs, 0)
    base_logits, _ = _jax_side(tiny["cfg"], tiny["params"], inputs, 0)
    return {"hf_dir": hf_dir, "figures": figures, "inputs": inputs, "jax": jax_logits, "base": base_logits}


def _modules(cfg) -> int:
    return 7 * cfg.text.num_hidden_layers + 5 * cfg.vision.depth  # vision: qkv, proj, gate, up, down


def test_merged_lora_export_loads_as_qwen25_with_the_adapted_logits(exported, tiny):
    from transformers import Qwen2_5_VLForConditionalGeneration

    assert exported["figures"]["adapted_modules"] == _modules(tiny["cfg"])
    assert np.abs(exported["jax"] - exported["base"]).max() > 1e-3  # the adapters matter
    model = load_hf_model(exported["hf_dir"], dtype="fp32")
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    hf_logits, _ = _hf_side(model, exported["inputs"], 0)
    valid = exported["inputs"]["attention_mask"].astype(bool)
    assert np.abs(hf_logits - exported["jax"])[valid].max() <= TOLERANCE


def test_peft_loads_the_adapter_onto_the_qwen25_base_with_the_same_logits(exported, tiny):
    peft = pytest.importorskip("peft")
    config = json.loads((exported["hf_dir"] / lora.ADAPTER_DIR / lora.PEFT_CONFIG).read_text())
    assert "mlp\\.gate_proj" in config["target_modules"] and config["r"] == 4
    base = load_hf_model(tiny["root"] / "hf", dtype="fp32")
    model = peft.PeftModel.from_pretrained(base, str(exported["hf_dir"] / lora.ADAPTER_DIR))
    layers = [name for name, _ in model.named_modules() if name.endswith("lora_A")]
    assert len(layers) == _modules(tiny["cfg"])  # the merger's mlp.0 / mlp.2 are not adapted
    hf_logits, _ = _hf_side(model, exported["inputs"], 0)
    valid = exported["inputs"]["attention_mask"].astype(bool)
    assert np.abs(hf_logits - exported["jax"])[valid].max() <= TOLERANCE


# Runs in a fresh interpreter: the fake device count must be set before jax is imported.
CHILD = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from vlmgym.models.family import load_config
    from vlmgym.models.checkpoint import load_checkpoint
    from vlmgym.models.qwen3_vl.mesh import make_mesh, param_shardings
    from vlmgym.models.qwen3_vl.processor import Processor
    from vlmgym.rl.policy import Qwen3VLPolicy
    from vlmgym.rollout.sampling import SamplingSettings

    root, data_path, out_path = sys.argv[1:]
    assert jax.device_count() == 4
    mesh = make_mesh(data=1, fsdp=2, tensor=2)
    cfg = load_config(root + "/jax")
    cfg, params = load_checkpoint(root + "/jax", shardings=param_shardings(cfg, mesh))
    P = jax.sharding.PartitionSpec
    assert params["text"]["layers"]["q"]["bias"].sharding.spec == P(None, "tensor")
    assert params["text"]["layers"]["gate"]["kernel"].sharding.spec == P(None, "fsdp", "tensor")
    processor = Processor.from_pretrained(root + "/hf")
    settings = SamplingSettings(max_new_tokens=6, eos_ids=tuple(processor.eos_token_ids),
                                pad_id=int(processor.pad_token_id))
    data = np.load(data_path, allow_pickle=False)
    policy = Qwen3VLPolicy(cfg, processor, settings, mesh=mesh)
    batch = policy.build_batch(OBSERVATIONS, data["tokens"], data["mask"])
    np.save(out_path, np.asarray(policy.logprobs(params, batch)))
""")


def test_a_two_by_two_mesh_gives_the_single_device_logprobs(tiny, tmp_path, run_on_cpu_devices):
    completions, mask = _completions(tiny)
    np.savez(tmp_path / "in.npz", tokens=completions, mask=mask)
    observations = ("from vlmgym.models.qwen3_vl.parity import parity_image\n"
                    f"OBSERVATIONS = [{{'messages': m, 'images': [parity_image(i, (96, 84))]}} "
                    f"for i, m in enumerate({MESSAGES!r})]\n")
    child = CHILD.replace("root, data_path", observations + "root, data_path", 1)
    run_on_cpu_devices(4, ["-c", child, str(tiny["root"]), tmp_path / "in.npz", tmp_path / "out.npy"])
    policy = Qwen3VLPolicy(tiny["cfg"], tiny["processor"], tiny["settings"])
    single = np.asarray(policy.logprobs(tiny["params"], policy.build_batch(_observations(), completions, mask)))
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), single, atol=TOLERANCE, rtol=0)


def test_the_family_comes_from_config_json(tiny):
    from vlmgym.models.family import folder_family

    assert folder_family(Path(tiny["root"]) / "jax") == "qwen2_5_vl" and tiny["cfg"].family == "qwen2_5_vl"
