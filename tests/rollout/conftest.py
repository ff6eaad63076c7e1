"""A tiny fp32 Qwen3-VL (HF folder + converted JAX params) shared by the rollout tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny
from vlmgym.models.qwen3_vl.config import Qwen3VLConfig, load_hf_config
from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors
from vlmgym.models.qwen3_vl.processor import Processor

QUESTION = "Where was this photo taken? Answer with the city, region, country, latitude and longitude."


@dataclass
class TinyModel:
    folder: str
    cfg: Qwen3VLConfig
    params: Any
    processor: Processor
    eos_ids: tuple[int, ...]
    pad_id: int


def _make_obs(index: int, num_images: int = 1) -> dict[str, Any]:
    """An env-style observation with `num_images` images of different sizes and a question of varying length."""
    rng = np.random.default_rng(index)
    sizes = [(64, 64), (96, 64), (64, 128)]
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes[:num_images]]
    text = QUESTION + " Look closely." * (index % 3)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    return {"images": images, "messages": [{"role": "user", "content": content}]}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    folder = tmp_path_factory.mktemp("rollout") / "tiny"
    corpus = [QUESTION, "Look closely.", "City: Paris\nRegion: Ile-de-France\nCountry: France\nLatitude: 48.85"]
    build_tiny(folder, corpus, seed=0, dims=TinyDims.scaled(hidden_size=64, num_layers=2), vocab_size=400)
    cfg = load_hf_config(folder)
    params = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(folder), cfg))
    processor = Processor.from_pretrained(folder)
    tok = processor.tokenizer
    eos = (tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>"))
    return TinyModel(str(folder), cfg, params, processor, eos, int(processor.pad_token_id))


@pytest.fixture(scope="session")
def make_obs():
    """Builds env-style observations: make_obs(index, num_images=1)."""
    return _make_obs
