"""The tiny base checkpoint: an ordinary HF folder that transformers loads offline, built deterministically."""

from __future__ import annotations

import json
import shutil
import sys
import types
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlmgym.models.qwen3_vl.base_model import SPECIAL_TOKENS, TinyDims, build_base_model, build_tiny, fetch_hub_model
from vlmgym.models.qwen3_vl.processor import QWEN3_VL_CHAT_TEMPLATE, Processor
from vlmgym.params import ModelParams, ParamsError, from_dict

# Used only while vlmgym.envs.corpus() is not importable (it is written concurrently with this module).
FALLBACK_CORPUS = [
    "Where was this street-view photo taken? Answer in five lines: country, region, city, latitude, longitude.",
    *[f"Country: {country}\nRegion: {region}\nCity: {city}\nLatitude: {lat}\nLongitude: {lon}"
      for country, region, city, lat, lon in [("France", "Bretagne", "Rennes", "48.11", "-1.68"),
                                              ("Japan", "Kantō", "Tōkyō", "35.68", "139.69"),
                                              ("Brazil", "Paraná", "Curitiba", "-25.43", "-49.27"),
                                              ("Kenya", "Nairobi", "Nairobi", "-1.29", "36.82")]],
    "Is this statement true or false? There are two red circles in the left image.",
]


def env_corpus() -> list[str] | None:
    try:
        from vlmgym.envs import corpus
    except ImportError:
        return None
    return corpus()


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return env_corpus() or FALLBACK_CORPUS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("tiny") / "base"
    return out, build_tiny(out, corpus, seed=0)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def street_image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (192, 256, 3), dtype=np.uint8))


def question(n_images: int) -> list[dict]:
    parts = [{"type": "image"}] * n_images + [{"type": "text", "text": "Where was this street-view photo taken?"}]
    return [{"role": "user", "content": parts}]


def test_folder_is_a_complete_hf_checkpoint(tiny):
    out, summary = tiny
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "preprocessor_config.json", "generation_config.json"):
        assert (out / name).exists(), name
    assert not list(out.parent.glob(".base.*")), "temporary folder left behind"
    config = json.loads((out / "config.json").read_text())
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "Qwen2Tokenizer"
    assert tokenizer_config["eos_token"] == "<|im_end|>" and tokenizer_config["pad_token"] == "<|endoftext|>"
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    assert config["text_config"]["vocab_size"] == summary["vocab_size"] >= len(vocab)
    assert [vocab[t] for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert config["image_token_id"] == vocab["<|image_pad|>"]
    assert config["vision_start_token_id"] == vocab["<|vision_start|>"]
    assert config["tie_word_embeddings"] is True
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    preprocessor = json.loads((out / "preprocessor_config.json").read_text())
    assert preprocessor["size"] == {"shortest_edge": 64 * 64, "longest_edge": 128 * 96}
    assert summary["image_tokens_256x192"] == 12
    # The figures quoted in base_model.py's docstring (and docs/pipeline.md, "The default model").
    assert (summary["params_vision"], summary["params_text"] - 128 * summary["vocab_size"]) == (466_624, 787_840)


def test_loads_offline_in_transformers_and_generates(tiny):
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen3VLForConditionalGeneration

    out, summary = tiny
    model = Qwen3VLForConditionalGeneration.from_pretrained(out, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert sum(p.numel() for p in model.parameters()) == summary["params_total"]
    assert tokenizer.chat_template == QWEN3_VL_CHAT_TEMPLATE
    processor = Processor.from_pretrained(out)
    assert processor.eos_token_ids == tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    batch = processor([question(1), question(2)], [[street_image(0)], [street_image(1), street_image(2)]])
    assert batch["image_tokens"].tolist() == [12, 24]
    hf_images = AutoImageProcessor.from_pretrained(out)([street_image(0), street_image(1), street_image(2)])
    np.testing.assert_array_equal(batch["pixel_values"], hf_images["pixel_values"])
    inputs = {k: torch.from_numpy(batch[k]).long() for k in ("input_ids", "attention_mask", "mm_token_type_ids",
                                                             "image_grid_thw")}
    inputs["pixel_values"] = torch.from_numpy(batch["pixel_values"])
    with torch.no_grad():
        own_positions = model(**inputs).logits
        our_positions = model(**inputs, position_ids=torch.from_numpy(batch["position_ids"]).long()).logits
        generated = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    # Our MRoPE positions are the ones HF computes for itself: identical logits on the real tokens.
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(our_positions[real], own_positions[real], rtol=0, atol=0)
    assert generated.shape == (2, batch["input_ids"].shape[1] + 6)
    assert (generated[:, : batch["input_ids"].shape[1]] == inputs["input_ids"]).all()
    assert int(generated.max()) < summary["vocab_size"]


def test_tokenizer_round_trips_env_text_and_keeps_special_tokens_whole(tiny, corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny[0], local_files_only=True)
    for text in corpus:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
    for index, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer(f"a{token}b", add_special_tokens=False)["input_ids"][1:-1] == [index]
    assert tokenizer.decode(tokenizer("Ünïcødé 東京 🚗")["input_ids"]) == "Ünïcødé 東京 🚗"
    # The corpus is what the tokenizer learned: its text takes far fewer tokens than bytes.
    total_tokens = sum(len(tokenizer(t)["input_ids"]) for t in corpus)
    assert total_tokens < 0.75 * sum(len(t.encode()) for t in corpus)


def test_same_seed_same_bytes_other_seed_other_weights(tiny, corpus, tmp_path):
    out, _ = tiny
    build_tiny(tmp_path / "again", corpus, seed=0)
    build_tiny(tmp_path / "other", corpus, seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "preprocessor_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    assert (tmp_path / "other" / "tokenizer.json").read_bytes() == (out / "tokenizer.json").read_bytes()
    assert (tmp_path / "other" / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()


def test_hf_source_uses_the_download_function(tiny, tmp_path):
    calls = []

    def fake_download(repo: str, local_dir: Path) -> None:
        calls.append(repo)
        shutil.copytree(tiny[0], local_dir, dirs_exist_ok=True)

    params = from_dict(ModelParams, {"source": "hf:Qwen/Qwen3-VL-4B-Instruct", "hf_dir": str(tmp_path / "base")})
    summary = build_base_model(params, download=fake_download)
    assert calls == ["Qwen/Qwen3-VL-4B-Instruct"]
    assert summary["source"] == "hf:Qwen/Qwen3-VL-4B-Instruct" and summary["model_type"] == "qwen3_vl"
    assert (tmp_path / "base" / "model.safetensors").read_bytes() == (tiny[0] / "model.safetensors").read_bytes()


def test_incomplete_snapshot_is_an_error_and_leaves_the_old_folder(tmp_path):
    out = tmp_path / "base"
    out.mkdir()
    (out / "keep.txt").write_text("previous checkpoint")

    def partial_download(repo: str, local_dir: Path) -> None:
        (local_dir / "config.json").write_text('{"model_type": "qwen3_vl"}')

    with pytest.raises(ValueError, match=r"hub snapshot of a/b: missing preprocessor_config.json, \*.safetensors"):
        fetch_hub_model("a/b", out, download=partial_download)
    assert [p.name for p in tmp_path.iterdir()] == ["base"]
    assert (out / "keep.txt").read_text() == "previous checkpoint"

    def wrong_model(repo: str, local_dir: Path) -> None:
        for name in ("preprocessor_config.json", "tokenizer.json", "model.safetensors"):
            (local_dir / name).write_text("{}")
        (local_dir / "config.json").write_text('{"model_type": "llava"}')

    with pytest.raises(ValueError, match="model_type is 'llava'"):
        fetch_hub_model("a/b", out, download=wrong_model)
    with pytest.raises(ValueError, match="expected 'hf:<owner>/<name>'"):
        fetch_hub_model("no-owner", out, download=wrong_model)


def test_tiny_source_builds_from_the_given_corpus(tiny, corpus, tmp_path):
    params = from_dict(ModelParams, {"hf_dir": str(tmp_path / "base")})
    summary = build_base_model(params, corpus=corpus)
    assert summary == tiny[1]
    assert (tmp_path / "base" / "model.safetensors").read_bytes() == (tiny[0] / "model.safetensors").read_bytes()
    with pytest.raises(ParamsError, match="model.source: 'hub' is neither"):
        build_base_model(from_dict(ModelParams, {"source": "hub"}))
    with pytest.raises(ParamsError, match="min_pixels"):
        build_base_model(from_dict(ModelParams, {"min_pixels": 20000, "max_pixels": 10000}))


def test_models_do_not_import_the_environments():
    # The corpus comes from the caller, so editing an env does not change the model code (nor its DVC deps).
    package = Path(__file__).parents[2] / "src" / "vlmgym" / "models"
    assert [p.name for p in package.rglob("*.py") if "vlmgym.envs import" in p.read_text()
            or "import vlmgym.envs" in p.read_text()] == []


def test_dims_that_qwen3_vl_cannot_run_are_rejected():
    with pytest.raises(ValueError, match=r"sum\(mrope_section\)=15 != head_dim/2=16"):
        TinyDims(mrope_section=(5, 5, 5)).validate(1000)
    with pytest.raises(ValueError, match="deepstack indexes"):
        TinyDims(deepstack_visual_indexes=(0, 2)).validate(1000)
    with pytest.raises(ValueError, match="perfect square"):
        TinyDims(num_position_embeddings=60).validate(1000)
    assert TinyDims.scaled(256, 6).num_heads == 8 and TinyDims.scaled(256, 6).intermediate_size == 768
    with pytest.raises(ValueError, match="multiple of 64"):
        TinyDims.scaled(100)


def test_stage_script_builds_and_logs(tmp_path, monkeypatch):
    import contextlib
    import importlib.util

    script = Path(__file__).parents[2] / "stages" / "base_model.py"
    if env_corpus() is None:
        fake_envs = types.ModuleType("vlmgym.envs")
        fake_envs.corpus = lambda: list(FALLBACK_CORPUS)
        monkeypatch.setitem(sys.modules, "vlmgym.envs", fake_envs)
    spec = importlib.util.spec_from_file_location("base_model_stage", script)
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    logged = {}

    class FakeRun:
        def log_metrics(self, metrics, step=None):
            logged["metrics"] = dict(metrics)

        def log_dict(self, obj, name):
            logged[name] = obj

    @contextlib.contextmanager
    def fake_stage_run(name, params, params_file=None, extra_params=None):
        logged["stage"], logged["params"], logged["params_file"] = name, params, params_file
        logged["extra_params"] = extra_params
        yield FakeRun()

    monkeypatch.setattr(stage.tracking, "stage_run", fake_stage_run)
    (tmp_path / "params.yaml").write_text(f"model:\n  seed: 3\n  hf_dir: {tmp_path / 'base'}\n")
    assert stage.main(["--params", str(tmp_path / "params.yaml")]) == 0
    assert logged["stage"] == "base_model" and logged["params"].seed == 3
    assert logged["extra_params"] == {"env.name": "geospot"}  # the active env's texts join the corpus
    assert logged["params_file"] == str(tmp_path / "params.yaml")  # tracking settings come from the same file
    assert logged["metrics"]["params_total"] == logged["base_model.json"]["params_total"] > 1_000_000
    assert logged["metrics"]["image_tokens_256x192"] == 12
    assert (tmp_path / "base" / "model.safetensors").exists()
