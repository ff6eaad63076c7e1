"""Session fixtures for the Qwen3-VL model tests: tiny random HF models, converted to JAX once."""

from __future__ import annotations

import pytest
from qwen_fixtures import Tiny, make_tiny


@pytest.fixture(scope="session")
def tiny_tied(tmp_path_factory) -> Tiny:
    """Tied embeddings, DeepStack taps after vision blocks 0 and 2."""
    return make_tiny(tmp_path_factory.mktemp("qwen"), "tied", True, (0, 2), seed=0)


@pytest.fixture(scope="session")
def tiny_untied(tmp_path_factory) -> Tiny:
    """Untied lm_head, DeepStack taps after vision blocks 1, 2 and 3."""
    return make_tiny(tmp_path_factory.mktemp("qwen"), "untied", False, (1, 2, 3), seed=1)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A complete tiny HF folder (tokenizer, chat template, preprocessor config) and its JAX conversion."""
    from vlmgym.models.checkpoint import convert_hf_to_jax
    from vlmgym.models.qwen3_vl.base_model import TinyDims, build_tiny

    root = tmp_path_factory.mktemp("tiny_folder")
    corpus = ["Where was this photo taken?", "country: France region: Brittany city: Brest", "The answer is Japan."]
    build_tiny(root / "hf", corpus * 4, seed=3, dims=TinyDims(tie_word_embeddings=False), vocab_size=400)
    convert_hf_to_jax(root / "hf", root / "jax")
    return root / "hf", root / "jax"
