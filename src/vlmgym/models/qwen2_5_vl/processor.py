"""Qwen2.5-VL input settings: Qwen3-VL's processor code with the Qwen2.5-VL hub settings (14-pixel patches, so sides
are multiples of 28; CLIP mean / std; the hub's preprocessor_config.json pixel budget) and chat template (a default
system prompt when the conversation has none; no tool section)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from vlmgym.models.qwen3_vl.processor import ImageSettings
from vlmgym.models.qwen3_vl.processor import preprocess_images as _preprocess

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HUB_MIN_PIXELS = 3136  # 56 * 56
HUB_MAX_PIXELS = 12845056  # 16384 merged tokens of 28 x 28 pixels
IMAGE_SETTINGS = ImageSettings(min_pixels=HUB_MIN_PIXELS, max_pixels=HUB_MAX_PIXELS, patch_size=14,
                               image_mean=CLIP_MEAN, image_std=CLIP_STD)
PROCESSOR_CLASS = "Qwen2_5_VLProcessor"

# The chat template of Qwen2.5-VL-*-Instruct's tokenizer_config.json / chat_template.json, byte for byte.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)


def preprocess_images(images: Sequence[Image.Image | np.ndarray],
                      settings: ImageSettings = IMAGE_SETTINGS) -> tuple[np.ndarray, np.ndarray]:
    """Images -> (pixel_values (N_patches, 3*2*14*14) float32, image_grid_thw (n_images, 3) int32)."""
    return _preprocess(images, settings=settings)
