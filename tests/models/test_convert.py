"""HF <-> JAX conversion: strict keys and shapes, sharded / bf16 / bare-key inputs, bit-exact export."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from vlmgym.models.checkpoint import (
    ExportCheckFailed,
    check_export,
    convert_hf_to_jax,
    export_and_check,
    export_to_hf,
    load_checkpoint,
    save_checkpoint,
)
from vlmgym.models.qwen3_vl.convert import ConversionError, hf_to_params, read_safetensors


@pytest.fixture(scope="module")
def state(tiny_tied):
    return read_safetensors(tiny_tied.hf_dir)


def test_renamed_key_is_rejected_by_name(tiny_tied, state):
    broken = dict(state)
    broken["model.language_model.layers.1.mlp.gate_projection.weight"] = broken.pop(
        "model.language_model.layers.1.mlp.gate_proj.weight")
    with pytest.raises(ConversionError, match=r"language_model\.layers\.1\.mlp\.gate_projection\.weight"):
        hf_to_params(broken, tiny_tied.cfg)


def test_missing_key_is_rejected_by_name(tiny_tied, state):
    broken = {k: v for k, v in state.items() if k != "model.visual.deepstack_merger_list.1.norm.bias"}
    with pytest.raises(ConversionError, match=r"missing key 'visual\.deepstack_merger_list\.1\.norm\.bias'"):
        hf_to_params(broken, tiny_tied.cfg)


def test_wrong_shape_is_rejected_by_name(tiny_tied, state, tmp_path):
    broken = dict(state)
    key = "model.language_model.layers.2.self_attn.k_proj.weight"
    broken[key] = np.zeros((broken[key].shape[0] + 1, broken[key].shape[1]), np.float32)
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(broken, str(folder / "model.safetensors"))
    shutil.copy(tiny_tied.hf_dir / "config.json", folder / "config.json")
    with pytest.raises(ConversionError, match=r"layers\.2\.self_attn\.k_proj\.weight': shape \(65, 64\)"):
        convert_hf_to_jax(folder, tmp_path / "jax")
    assert not (tmp_path / "jax").exists()


def test_sharded_bf16_bare_keys_convert(tiny_tied, state, tmp_path):
    bare = {k.removeprefix("model."): v.astype(ml_dtypes.bfloat16) for k, v in state.items()}
    keys = sorted(bare)
    shards = {"part-1.safetensors": keys[: len(keys) // 2], "part-2.safetensors": keys[len(keys) // 2:]}
    folder = tmp_path / "hf"
    folder.mkdir()
    for name, names in shards.items():
        save_file({k: bare[k] for k in names}, str(folder / name))
    index = {"weight_map": {k: name for name, names in shards.items() for k in names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(tiny_tied.hf_dir / "config.json", folder / "config.json")
    cfg, out = convert_hf_to_jax(folder, tmp_path / "jax")
    assert cfg.param_dtype == "bf16"
    _, params = load_checkpoint(out)
    expected = hf_to_params({k: v.astype(ml_dtypes.bfloat16) for k, v in state.items()}, tiny_tied.cfg)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(np.asarray(got), want)
    _, as_fp32 = load_checkpoint(out, param_dtype="fp32")
    assert jax.tree.leaves(as_fp32)[0].dtype == np.float32


def test_export_round_trip_is_bit_exact_and_loads_in_transformers(tiny_folder, tmp_path):
    import torch
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    hf_dir, jax_dir = tiny_folder
    out = export_to_hf(jax_dir, tmp_path / "exported")
    original, exported = read_safetensors(hf_dir), read_safetensors(out)
    assert sorted(original) == sorted(exported)
    for key, value in original.items():
        assert exported[key].dtype == value.dtype
        assert exported[key].tobytes() == value.tobytes(), key
    model = Qwen3VLForConditionalGeneration.from_pretrained(out, local_files_only=True)
    reference = Qwen3VLForConditionalGeneration.from_pretrained(hf_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    ids = torch.tensor([tokenizer.encode("Where was this photo taken?")])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    assert tokenizer.decode(ids[0]) == "Where was this photo taken?"


def test_export_check_passes_a_faithful_export_and_removes_a_tampered_one(tiny_folder, tmp_path, monkeypatch):
    hf_dir, jax_dir = tiny_folder
    out, figures = export_and_check(jax_dir, tmp_path / "exported")
    state = read_safetensors(out)
    assert figures["tensors"] == len(state) and figures["parameters"] == figures["transformers_parameters"]
    assert figures["bytes"] == (out / "model.safetensors").stat().st_size
    key = "model.language_model.norm.weight"
    save_file({**state, key: state[key] + 1}, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ExportCheckFailed, match="language_model.norm.weight' differs"):
        check_export(jax_dir, out)
    extra = {**state, "model.visual.extra.weight": state[key]}
    save_file(extra, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ExportCheckFailed, match=r"unexpected \['model.visual.extra.weight'\]"):
        check_export(jax_dir, out)
    # A folder transformers cannot fill (here: no tensors at all) fails too, and the failed export is removed.
    from vlmgym.models.qwen3_vl import convert

    monkeypatch.setattr(convert, "params_to_hf", lambda params, cfg: {})
    with pytest.raises(ExportCheckFailed, match="transformers reports {'missing_keys'"):
        export_and_check(jax_dir, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_save_checkpoint_replaces_atomically_and_round_trips(tiny_tied, tmp_path):
    target = tmp_path / "ckpt"
    save_checkpoint(target, tiny_tied.cfg, tiny_tied.params)
    doubled = jax.tree.map(lambda x: x * 2, tiny_tied.params)
    save_checkpoint(target, tiny_tied.cfg, doubled)  # replaces the first one
    cfg, params = load_checkpoint(target)
    assert cfg == tiny_tied.cfg
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(doubled)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp or old folders left
    with pytest.raises(ConversionError, match="not a vlmgym JAX checkpoint"):
        load_checkpoint(tmp_path)


def _file_digests(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_params_give_the_same_bytes(tiny_tied, tmp_path):
    # DVC hashes a model folder by its bytes: saving equal params twice must give equal files, or every stage
    # downstream of a rerun stage would rerun too.
    first, second = tmp_path / "first", tmp_path / "second"
    save_checkpoint(first, tiny_tied.cfg, tiny_tied.params)
    save_checkpoint(second, tiny_tied.cfg, tiny_tied.params)
    digests = _file_digests(first)
    assert any(name.startswith("params/") for name in digests)
    assert digests == _file_digests(second)
    changed = jax.tree.map(lambda x: x, tiny_tied.params)
    changed["text"]["norm"]["scale"] = changed["text"]["norm"]["scale"] + 1
    save_checkpoint(second, tiny_tied.cfg, changed)
    assert digests != _file_digests(second)
    _, params = load_checkpoint(second)
    np.testing.assert_array_equal(np.asarray(params["text"]["norm"]["scale"]),
                                  np.asarray(changed["text"]["norm"]["scale"]))


def test_saving_a_checkpoint_logs_no_ocdbt_merge_warning(tiny_tied, tmp_path, caplog):
    # Orbax warned "Skipping merge of OCDBT checkpoints: No per-process OCDBT checkpoint subdirs found" on every
    # save of a model folder (written without OCDBT, so there is nothing to merge).
    with caplog.at_level(logging.INFO):
        save_checkpoint(tmp_path / "ckpt", tiny_tied.cfg, tiny_tied.params)
        assert (tmp_path / "ckpt" / "params").is_dir()
        assert not [r.getMessage() for r in caplog.records if "OCDBT" in r.getMessage()]
        # The filter is scoped to the save: the same warning logged after it still shows.
        logging.getLogger("absl").warning("Skipping merge of OCDBT checkpoints: No per-process OCDBT checkpoint "
                                          "subdirs found in %s, ", tmp_path / "ckpt" / "params")
    assert [r.levelname for r in caplog.records if "OCDBT" in r.getMessage()] == ["WARNING"]
