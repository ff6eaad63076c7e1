"""vlmgym's Qwen2.5-VL input processing equals transformers': the image preprocessing equals Qwen2VLImageProcessorPil
with the same settings, and the whole processor (chat template, tokens, image pads, pixels) Qwen2_5_VLProcessor."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

from vlmgym.models.qwen2_5_vl.processor import CHAT_TEMPLATE, IMAGE_SETTINGS, PROCESSOR_CLASS, preprocess_images


def test_equals_transformers_pil_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(0)
    # aligned, resized (not multiples of 28), and scaled up to the pixel budget's floor
    sizes = [(112, 168), (101, 250), (30, 40)]
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    settings = dataclasses.replace(IMAGE_SETTINGS, max_pixels=28 * 28 * 64)
    pixels, grids = preprocess_images(images, settings)
    hf = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                                  size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels})
    out = hf(images=images, return_tensors="np")
    np.testing.assert_array_equal(grids, out["image_grid_thw"])
    assert pixels.shape == out["pixel_values"].shape and pixels.shape[1] == 3 * 2 * 14 * 14
    np.testing.assert_array_equal(pixels, out["pixel_values"])
    assert [tuple(g) for g in grids][0] == (1, 8, 12)


@pytest.fixture(scope="module")
def qwen25_folder(tmp_path_factory):
    """A Qwen2.5-VL processor folder as the tiny base model writes it: trained tokenizer with the Instruct chat
    template, preprocessor_config.json with Qwen2.5-VL's patch size, mean and std under a small pixel budget."""
    from vlmgym.models.qwen3_vl.base_model import train_tokenizer
    from vlmgym.models.qwen3_vl.processor import image_processor_config

    folder = tmp_path_factory.mktemp("qwen25_processor")
    corpus = ["Where was this photo taken? Answer with the country, then the city.", "Is the left one a cat?"] * 20
    train_tokenizer(corpus, 512, CHAT_TEMPLATE).save_pretrained(folder)
    settings = dataclasses.replace(IMAGE_SETTINGS, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 48)
    (folder / "preprocessor_config.json").write_text(json.dumps(image_processor_config(settings, PROCESSOR_CLASS)))
    return folder


def transformers_processor(folder, monkeypatch):
    """transformers' Qwen2_5_VLProcessor over the folder's tokenizer and PIL image processor. Its constructor checks
    a video processor class that needs torchvision, which the CPU torch wheel this project pins cannot load; no
    video goes through it here, so that class check is skipped."""
    from transformers import AutoTokenizer, ProcessorMixin, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(folder), tokenizer=tokenizer,
                               video_processor=None, chat_template=tokenizer.chat_template)


CONVERSATIONS = {
    "one image, default system prompt": ([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Where was this photo taken?"}]}], [(192, 256)]),
    "two images, own system prompt": ([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": [
        {"type": "text", "text": "Is the left one a cat?"}, {"type": "image"}, {"type": "image"}]}],
        [(101, 250), (56, 84)]),
    "text only, a finished turn": ([{"role": "user", "content": "Where?"}, {"role": "assistant", "content": "Paris"},
                                    {"role": "user", "content": "The country?"}], []),
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_the_processor_equals_transformers_qwen25_processor(qwen25_folder, monkeypatch, name):
    """Token ids (chat template rendered, image pads expanded), pixel values and grids of vlmgym's Processor on a
    Qwen2.5-VL folder equal transformers' Qwen2_5_VLProcessor's on the same conversation and images."""
    from vlmgym.models.qwen3_vl.processor import Processor

    messages, sizes = CONVERSATIONS[name]
    rng = np.random.default_rng(len(name))
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    hf = transformers_processor(qwen25_folder, monkeypatch)
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = hf(text=[text], images=images or None, return_tensors="np")
    got = Processor.from_pretrained(qwen25_folder)([messages], [images])
    np.testing.assert_array_equal(got["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(got["mm_token_type_ids"], expected["mm_token_type_ids"])
    if images:
        assert (expected["input_ids"] == hf.image_token_id).sum() == expected["pixel_values"].shape[0] // 4 > 0
        np.testing.assert_array_equal(got["image_grid_thw"], expected["image_grid_thw"])
        np.testing.assert_array_equal(got["pixel_values"], expected["pixel_values"])
    else:
        assert "pixel_values" not in expected and got["pixel_values"].shape[0] == 0
