"""The reference recipe in configs/ loads and validates with every section's rules."""

from pathlib import Path

from vlmgym.params import load_all

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "qwen3vl_4b_osv5m.yaml"


def test_reference_recipe_loads_and_validates():
    sections = load_all(CONFIG)
    train, model = sections["train"], sections["model"]
    assert (train.optimizer.lr, train.steps, train.group_size) == (5e-7, 10000, 8)
    assert model.source == "hf:Qwen/Qwen3-VL-4B-Instruct" and model.param_dtype == "bf16"
    assert sections["env"].name == "geospot" and sections["sft"].steps == 0
    # Every sequence of a step splits evenly into micro-batches, and the mesh is (data, fsdp, tensor).
    assert (train.batch_prompts * train.group_size) % train.micro_batches == 0
    assert len(train.mesh) == 3
    text = CONFIG.read_text()
    assert "dvc repro" in text and "Hardware" in text and "Expectation" in text


LORA = CONFIG.parent / "qwen3vl_4b_osv5m_lora.yaml"


def test_lora_recipe_overlays_the_reference_recipe(tmp_path):
    from vlmgym.cli.presets import apply_preset

    params = tmp_path / "params.yaml"
    params.write_text((CONFIG.parents[1] / "params.yaml").read_text())
    apply_preset(CONFIG, params)
    sections = apply_preset(LORA, params)
    train, model = sections["train"], sections["model"]
    assert train.lora.rank == 16 and train.lora.alpha == 32.0 and not train.lora.vision
    # one GPU: no mesh; the base is frozen whole by LoRA (no freeze), activations checkpointed (the planned row)
    assert train.mesh == [] and train.freeze == "none" and train.remat == "layer"
    assert (train.batch_prompts * train.group_size) % train.micro_batches == 0
    assert model.source == "hf:Qwen/Qwen3-VL-4B-Instruct" and train.steps == 10000
    text = LORA.read_text()
    assert "BENCHMARKS.md" in text and "LoRA on one 80 GB GPU" in text and "dvc repro" in text
