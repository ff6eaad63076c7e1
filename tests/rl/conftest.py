"""A tiny Qwen3-VL and a two-sample geospot env shared by the policy, trainer and sharding tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

GEO_META = [
    {"latitude": 48.8566, "longitude": 2.3522, "country": "FR", "region": "Ile-de-France", "city": "Paris"},
    {"latitude": 52.52, "longitude": 13.405, "country": "DE", "region": "Berlin", "city": "Berlin"},
]


@dataclass
class GeoSample:
    key: str
    images: list
    meta: dict


@dataclass
class TinyVLM:
    folder: str
    cfg: Any
    params: Any
    processor: Any
    samples: list


def geo_samples() -> list[GeoSample]:
    """Two labelled 64x64 noise images."""
    rng = np.random.default_rng(0)
    return [GeoSample(str(i), [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))], meta)
            for i, meta in enumerate(GEO_META)]


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVLM:
    from vlmgym.envs.geospot import PROMPT, GeospotEnv
    from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny
    from vlmgym.models.qwen3_vl.config import load_hf_config
    from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
    from vlmgym.models.qwen3_vl.processor import Processor

    samples = geo_samples()
    env = GeospotEnv(samples)
    corpus = [PROMPT] + [env.ideal_answer(s.meta) for s in samples]
    folder = tmp_path_factory.mktemp("rl_tiny") / "tiny"
    build_tiny(folder, corpus, seed=0, dims=TinyDims.scaled(hidden_size=64, num_layers=2), vocab_size=400)
    cfg = load_hf_config(folder)
    params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(folder), cfg))
    return TinyVLM(str(folder), cfg, params, Processor.from_pretrained(folder), samples)
