"""`vlmgym parity` and the convert stage on a complete tiny checkpoint folder."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import jax
import numpy as np
from PIL import Image

from vlmgym.models.checkpoint import load_checkpoint, save_checkpoint
from vlmgym.models.qwen3_vl import parity

REPO = Path(__file__).resolve().parents[2]


def _image(path: Path) -> Path:
    pixels = np.random.default_rng(0).integers(0, 255, (150, 260, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_parity_cli_passes_on_a_faithful_conversion(tiny_folder, tmp_path, capsys):
    hf_dir, jax_dir = tiny_folder
    image = _image(tmp_path / "a.png")
    code = parity.main(["--hf", str(hf_dir), "--jax", str(jax_dir), "--image", str(image), "--image", str(image),
                        "--prompt", "Where was this photo taken?", "--max-new-tokens", "3"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["passed"] and report["dtype"] == "fp32"
    assert report["max_abs_logit_diff"] < 1e-4
    assert report["greedy_token_agreement"] == 1.0
    case = report["cases"][0]
    assert case["images"] == 2 and case["hf_logits_shape"] == case["jax_logits_shape"]
    assert case["greedy_generation_agreement"] == 1.0 and len(case["jax_generated"]) == 3


def test_parity_cli_fails_on_a_corrupted_checkpoint(tiny_folder, tmp_path, capsys):
    hf_dir, jax_dir = tiny_folder
    cfg, params = load_checkpoint(jax_dir)
    params["text"]["layers"]["q_norm"]["scale"] = params["text"]["layers"]["q_norm"]["scale"] * 1.01
    bad = save_checkpoint(tmp_path / "bad", cfg, params, hf_config=json.loads((jax_dir / "config.json").read_text()),
                          side_files_from=jax_dir)
    code = parity.main(["--hf", str(hf_dir), "--jax", str(bad), "--max-new-tokens", "0"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and not report["passed"]
    assert report["max_abs_logit_diff"] > 1e-4


def test_convert_stage_converts_checks_parity_and_logs(tiny_folder, tmp_path, monkeypatch):
    hf_dir, _ = tiny_folder
    params_file = tmp_path / "params.yaml"
    out = tmp_path / "models" / "jax" / "base"
    params_file.write_text(f"model:\n  hf_dir: {hf_dir}\n  jax_dir: {out}\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("convert_stage", REPO / "stages" / "convert.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    assert stage.main(["--params", str(params_file)]) == 0
    cfg, params = load_checkpoint(out)
    assert (out / "tokenizer.json").exists() and (out / "preprocessor_config.json").exists()
    assert not cfg.tie_word_embeddings and "lm_head" in params
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    import mlflow

    runs = mlflow.search_runs(experiment_names=["vlmgym"])
    assert runs["metrics.max_abs_logit_diff"].iloc[0] < 1e-4
    assert runs["metrics.image.max_abs_logit_diff"].iloc[0] < 1e-4
    shutil.rmtree(out)
