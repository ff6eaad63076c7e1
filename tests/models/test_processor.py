"""The numpy processor against transformers: image processor, chat template, get_rope_index."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen3VLModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlmgym.models.qwen3_vl.base_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS, train_tokenizer
from vlmgym.models.qwen3_vl.processor import (
    IMAGE_PAD,
    QWEN3_VL_CHAT_TEMPLATE,
    ImageSettings,
    Processor,
    build_inputs,
    expand_image_tokens,
    get_rope_index,
    load_tokenizer,
    padded_length,
    preprocess_images,
    read_image_settings,
    render_chat,
    smart_resize,
)

TEXTS = ["Where was this photo taken? Answer with country, region, city, latitude and longitude.",
         "Country: France\nRegion: Bretagne\nCity: Rennes\nLatitude: 48.11\nLongitude: -1.68",
         "Is the statement true for the two images? The left image has more circles than the right one."] * 4


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400)


def hf_image_processor(min_pixels: int, max_pixels: int) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})


def random_image(height: int, width: int, seed: int, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)


def hf_rope_index(input_ids, grid_thw, attention_mask, image_token_id):
    """Qwen3VLModel.get_rope_index, called on an object carrying only what it reads."""
    vision_config = types.SimpleNamespace(spatial_merge_size=2)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision_config))
    fake.get_vision_position_ids = functools.partial(Qwen3VLModel.get_vision_position_ids, fake)
    input_ids = torch.from_numpy(np.asarray(input_ids, np.int64))
    positions, deltas = Qwen3VLModel.get_rope_index(
        fake, input_ids, mm_token_type_ids=(input_ids == image_token_id).int(),
        image_grid_thw=None if grid_thw is None else torch.from_numpy(np.asarray(grid_thw, np.int64)),
        attention_mask=None if attention_mask is None else torch.from_numpy(np.asarray(attention_mask, np.int64)))
    return positions.numpy(), deltas.numpy()


def test_chat_template_is_qwen3_vl_instruct_byte_for_byte():
    data = QWEN3_VL_CHAT_TEMPLATE.encode()
    assert len(data) == 5292
    assert hashlib.sha256(data).hexdigest() == "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


@pytest.mark.parametrize(("sizes", "min_pixels", "max_pixels"), [
    ([(96, 128), (64, 64), (160, 96)], TINY_MIN_PIXELS, 160 * 96),  # 32-aligned, in range: unchanged size
    ([(192, 256), (300, 500), (33, 47)], TINY_MIN_PIXELS, TINY_MAX_PIXELS),  # resized down and up
])
def test_preprocess_equals_transformers_pil_processor(sizes, min_pixels, max_pixels):
    images = [random_image(h, w, seed) for seed, (h, w) in enumerate(sizes)]
    ours, grid = preprocess_images(images, min_pixels, max_pixels)
    theirs = hf_image_processor(min_pixels, max_pixels)(images, return_tensors="np")
    assert ours.dtype == np.float32 and ours.shape[1] == 1536
    np.testing.assert_array_equal(grid, theirs["image_grid_thw"])
    np.testing.assert_array_equal(ours, theirs["pixel_values"])


def test_preprocess_converts_grey_and_transparent_images_like_transformers():
    images = [random_image(64, 96, 1, "L"), random_image(96, 64, 2, "RGBA")]
    ours, grid = preprocess_images(images, TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    theirs = hf_image_processor(TINY_MIN_PIXELS, TINY_MAX_PIXELS)(images, return_tensors="np")
    np.testing.assert_array_equal(grid, theirs["image_grid_thw"])
    np.testing.assert_array_equal(ours, theirs["pixel_values"])


@pytest.mark.parametrize(("height", "width", "tokens"), [(300, 500, 144), (224, 224, 64), (1000, 17, None),
                                                         (4000, 3000, None), (31, 33, None)])
def test_image_token_counts_with_hub_budget(height, width, tokens):
    settings = ImageSettings()
    expected = hf_image_processor(65536, 16777216).get_number_of_image_patches(height, width) // 4
    assert settings.num_image_tokens(height, width) == expected
    if tokens is not None:
        assert settings.num_image_tokens(height, width) == tokens
    assert smart_resize(300, 500) == (288, 512)


def test_tiny_budget_makes_a_256x192_image_12_tokens():
    assert ImageSettings(TINY_MIN_PIXELS, TINY_MAX_PIXELS).num_image_tokens(192, 256) == 12
    assert smart_resize(192, 256, 32, TINY_MIN_PIXELS, TINY_MAX_PIXELS) == (96, 128)


def test_bad_images_raise_with_their_index():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500)
    with pytest.raises(ValueError, match="image 1"):
        preprocess_images([random_image(64, 64, 0), "not an image"], TINY_MIN_PIXELS, TINY_MAX_PIXELS)


def conversation(n_images: int, question: str, answer: str | None = None, system: str | None = None) -> list[dict]:
    messages = [{"role": "system", "content": system}] if system else []
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": question}]
    messages.append({"role": "user", "content": content})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_equals_tokenizer_apply_chat_template(tokenizer, add_generation_prompt):
    chats = [conversation(1, "Where is this?"), conversation(2, "Left or right?", "Left", system="Be brief."),
             conversation(1, "Where?", "Country: France") + conversation(0, "And the city?")]
    for messages in chats:
        ours = render_chat(messages, add_generation_prompt)
        theirs = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours == theirs
    text = render_chat(conversation(1, "Where is this?"))
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Where is this?<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_expand_image_tokens_checks_the_placeholder_count():
    assert expand_image_tokens(f"a{IMAGE_PAD}b{IMAGE_PAD}", [2, 1]) == f"a{IMAGE_PAD * 2}b{IMAGE_PAD}"
    with pytest.raises(ValueError, match="2 <|image_pad|> placeholders but 1 images"):
        expand_image_tokens(f"a{IMAGE_PAD}b{IMAGE_PAD}", [2])


def test_rope_index_equals_hf_on_handmade_ids():
    pad, img = 0, 7
    # Row 0: two images (2x3 and 1x1 merged) with text between; row 1: text only; row 2: one 3x2 image, left pad.
    row0 = [5, 6, 8] + [img] * 6 + [9, 5, 8] + [img] + [9, 6, 6]
    row1 = [5, 6, 6, 5]
    row2 = [8] + [img] * 6 + [9, 5]
    length = max(len(row0), len(row1), len(row2)) + 2
    ids = np.full((3, length), pad)
    mask = np.zeros((3, length), np.int64)
    for b, row in enumerate([row0, row1, row2]):
        ids[b, length - len(row):] = row
        mask[b, length - len(row):] = 1
    grid = np.array([[1, 4, 6], [1, 2, 2], [1, 6, 4]])
    ours, our_deltas = get_rope_index(ids, grid, mask, image_token_id=img)
    theirs, their_deltas = hf_rope_index(ids, grid, mask, img)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(our_deltas, their_deltas)
    assert our_deltas[0, 0] == (3 + 3 + 3 + 1 + 3) - len(row0)  # text 3, image max(2,3), text 3, image 1, text 3
    with pytest.raises(ValueError, match=r"grid \[1, 4, 4\] needs 4"):
        get_rope_index(ids, np.array([[1, 4, 4], [1, 2, 2], [1, 6, 4]]), mask, image_token_id=img)
    with pytest.raises(ValueError, match="4 images"):
        get_rope_index(ids, np.concatenate([grid, grid[:1]]), mask, image_token_id=img)


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_build_inputs_matches_hf_rope_index_and_pads(tokenizer, padding_side):
    images = [[random_image(192, 256, 0)], [random_image(300, 500, 1), random_image(64, 64, 2)], []]
    messages = [conversation(1, "Where was this photo taken?"), conversation(2, "Is the left one red?"),
                conversation(0, "Say hello.")]
    batch = build_inputs(tokenizer, messages, images, min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS,
                         padding_side=padding_side, pad_to_multiple=16)
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape[1] % 16 == 0 and ids.shape[1] >= batch["prompt_lengths"].max()
    assert batch["image_grid_thw"].tolist() == [[1, 6, 8], [1, 4, 8], [1, 4, 4]]  # 300x500 -> 64x128
    assert batch["image_tokens"].tolist() == [12, 8 + 4, 0]
    assert ((ids == image_token_id).sum(axis=1) == batch["image_tokens"]).all()
    assert batch["pixel_values"].shape == (48 + 32 + 16, 1536)
    np.testing.assert_array_equal(mask.sum(axis=1), batch["prompt_lengths"])
    real_first = mask[:, 0] == 1
    assert real_first.all() if padding_side == "right" else mask[:, -1].all()
    assert (ids[mask == 0] == tokenizer.pad_token_id).all()
    theirs, their_deltas = hf_rope_index(ids, batch["image_grid_thw"], mask, image_token_id)
    np.testing.assert_array_equal(batch["position_ids"], theirs)
    np.testing.assert_array_equal(batch["rope_deltas"], their_deltas)
    np.testing.assert_array_equal(batch["mm_token_type_ids"], (ids == image_token_id).astype(np.int32))
    # The unpadded ids are the tokenizer's own encoding of the rendered, expanded chat.
    row = ids[0][mask[0] == 1].tolist()
    text = expand_image_tokens(tokenizer.apply_chat_template(messages[0], tokenize=False, add_generation_prompt=True),
                               [12])
    assert row == tokenizer(text)["input_ids"]


def test_build_inputs_rejects_mismatches(tokenizer):
    image = random_image(64, 64, 0)
    with pytest.raises(ValueError, match="row 0: messages have 2 image parts but 1 images"):
        build_inputs(tokenizer, [conversation(2, "q")], [[image]])
    with pytest.raises(ValueError, match="row 0: the chat text holds 2 .* for 1 images"):
        build_inputs(tokenizer, [conversation(1, f"q {IMAGE_PAD}")], [[image]], min_pixels=TINY_MIN_PIXELS,
                     max_pixels=TINY_MAX_PIXELS)
    with pytest.raises(ValueError, match="padding_side"):
        build_inputs(tokenizer, [conversation(0, "q")], [[]], padding_side="middle")


def test_padded_length_buckets():
    assert padded_length(37) == 37
    assert padded_length(37, pad_to_multiple=16) == 48
    assert padded_length(37, buckets=[32, 64, 128]) == 64
    assert padded_length(64, buckets=[128, 64]) == 64
    with pytest.raises(ValueError, match="largest bucket 128"):
        padded_length(129, buckets=[64, 128])


def test_processor_from_pretrained_reads_budget_and_template(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        '{"size": {"shortest_edge": 4096, "longest_edge": 12288}, "patch_size": 16, "merge_size": 2,'
        ' "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}')
    processor = Processor.from_pretrained(tmp_path)
    assert processor.settings == read_image_settings(tmp_path / "preprocessor_config.json")
    assert (processor.settings.min_pixels, processor.settings.max_pixels) == (4096, 12288)
    assert processor.chat_template == QWEN3_VL_CHAT_TEMPLATE
    assert processor.eos_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]  # no generation_config.json
    assert processor.num_image_tokens(192, 256) == 12
    batch = processor([conversation(1, "Where?")], [[random_image(192, 256, 3)]], buckets=[64, 128])
    assert batch["input_ids"].shape == (1, 64) and batch["image_tokens"].tolist() == [12]
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        Processor.from_pretrained(tmp_path / "missing")


def test_the_tokenizer_loads_as_auto_tokenizer_does_without_importing_torch(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_vl"}')
    direct, auto = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert type(direct) is type(auto) and direct.get_vocab() == auto.get_vocab()
    assert direct.all_special_tokens == auto.all_special_tokens and direct.chat_template == auto.chat_template
    for text in [*TEXTS, "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Ünïcode  東京<|im_end|>"]:
        ids = direct(text)["input_ids"]
        assert ids == auto(text)["input_ids"] and direct.decode(ids) == auto.decode(ids)
    loads = ("import sys; from pathlib import Path; from vlmgym.models.qwen3_vl.processor import load_tokenizer; "
             f"load_tokenizer(Path({str(tmp_path)!r})); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", loads], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
