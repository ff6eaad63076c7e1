"""A tiny fp32 Qwen3-VL HF folder for the benchmark tests (the dims of the rollout tests' model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny

QUESTION = "Where was this photo taken? Answer with the city, region, country, latitude and longitude."


@pytest.fixture(scope="session")
def bench_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bench") / "tiny"
    corpus = [QUESTION, "Look closely.", "City: Paris\nRegion: Ile-de-France\nCountry: France\nLatitude: 48.85"]
    build_tiny(folder, corpus, seed=0, dims=TinyDims.scaled(hidden_size=64, num_layers=2), vocab_size=400)
    return folder
