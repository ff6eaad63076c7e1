"""Qwen3-VL input processing in numpy: images to patches, chat to token ids, MRoPE position ids.

Everything here mirrors transformers (the ground truth, checked by tests/models/test_processor.py):
`Qwen2VLImageProcessorPil` with Qwen3-VL settings, the Qwen3-VL chat template, the image-token
expansion of `Qwen3VLProcessor` and `Qwen3VLModel.get_rope_index`. No torch: the outputs are numpy
arrays ready for the JAX model and the rollout engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vlmgym.models.qwen3_vl.chat import END_OF_TURN, IMAGE_PAD, TOKEN_IDS, VISION_END, VISION_START

PATCH_SIZE = 16
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
RESCALE_FACTOR = 1 / 255
HUB_MIN_PIXELS = 65536
HUB_MAX_PIXELS = 16777216


# The chat template shipped with Qwen3-VL-*-Instruct, byte for byte (5292 bytes, sha256 3636d0f0...a489e4):
# no default system prompt; an image part renders as <|vision_start|><|image_pad|><|vision_end|>.
QWEN3_VL_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501


# --- images -------------------------------------------------------------------


def smart_resize(height: int, width: int, factor: int = PATCH_SIZE * MERGE_SIZE,
                 min_pixels: int = HUB_MIN_PIXELS, max_pixels: int = HUB_MAX_PIXELS) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, pixel count in [min_pixels, max_pixels], aspect kept."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        ratio = max(height, width) / min(height, width)
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {ratio}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image: Image.Image | np.ndarray) -> Image.Image:
    """RGB PIL image; transparency is composited onto white, as transformers does."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise ValueError(f"array images must be uint8 (H, W) or (H, W, C), got {image.dtype} {image.shape}")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL image or a uint8 array, got {type(image).__name__}")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def resize_image(image: Image.Image | np.ndarray, min_pixels: int, max_pixels: int,
                 factor: int = PATCH_SIZE * MERGE_SIZE) -> np.ndarray:
    """RGB, bicubic resize to the smart_resize size; returns uint8 (H, W, 3)."""
    rgb = to_rgb(image)
    height, width = smart_resize(rgb.height, rgb.width, factor, min_pixels, max_pixels)
    return np.asarray(rgb.resize((width, height), resample=Image.Resampling.BICUBIC))


def patchify(image: np.ndarray, patch_size: int = PATCH_SIZE, merge_size: int = MERGE_SIZE,
             temporal_patch_size: int = TEMPORAL_PATCH_SIZE) -> tuple[np.ndarray, int, int]:
    """(C, H, W) float image -> rows (C*T*P*P,) in 2x2 merge-block order, plus the patch grid (h, w)."""
    channels, height, width = image.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = image.reshape(channels, grid_h // merge_size, merge_size, patch_size,
                            grid_w // merge_size, merge_size, patch_size)
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh, gw, mh, mw, C, ph, pw)
    # A still image is one frame repeated over the temporal patch.
    patches = np.broadcast_to(patches[:, :, :, :, :, None],
                              (*patches.shape[:5], temporal_patch_size, *patches.shape[5:]))
    rows = patches.reshape(grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    return np.ascontiguousarray(rows, dtype=np.float32), grid_h, grid_w


@dataclass(frozen=True)
class ImageSettings:
    """Pixel budget and patch geometry of the image processor (preprocessor_config.json)."""

    min_pixels: int = HUB_MIN_PIXELS
    max_pixels: int = HUB_MAX_PIXELS
    patch_size: int = PATCH_SIZE
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE
    merge_size: int = MERGE_SIZE
    image_mean: tuple[float, ...] = IMAGE_MEAN
    image_std: tuple[float, ...] = IMAGE_STD
    rescale_factor: float = RESCALE_FACTOR

    @property
    def factor(self) -> int:
        """Side lengths are multiples of this (one merged token covers factor x factor pixels)."""
        return self.patch_size * self.merge_size

    def num_image_tokens(self, height: int, width: int) -> int:
        """LLM tokens one image of this size becomes."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return (h // self.factor) * (w // self.factor)


def preprocess_images(images: Sequence[Image.Image | np.ndarray], min_pixels: int = HUB_MIN_PIXELS,
                      max_pixels: int = HUB_MAX_PIXELS, settings: ImageSettings | None = None,
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Images -> (pixel_values (N_patches, C*T*P*P) float32, image_grid_thw (n_images, 3) int32)."""
    s = settings or ImageSettings(min_pixels=min_pixels, max_pixels=max_pixels)
    mean = np.asarray(s.image_mean, dtype=np.float32)
    std = np.asarray(s.image_std, dtype=np.float32)
    rows, grids = [], []
    for index, image in enumerate(images):
        try:
            pixels = resize_image(image, s.min_pixels, s.max_pixels, s.factor)
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(f"image {index}: {err}") from err
        # Same arithmetic as transformers: rescale in float64, cast to float32, then normalise in float32.
        scaled = (pixels.astype(np.float64) * s.rescale_factor).astype(np.float32)
        normalised = ((scaled - mean) / std).transpose(2, 0, 1)
        patches, grid_h, grid_w = patchify(normalised, s.patch_size, s.merge_size, s.temporal_patch_size)
        rows.append(patches)
        grids.append((1, grid_h, grid_w))
    patch_dim = 3 * s.temporal_patch_size * s.patch_size * s.patch_size
    pixel_values = np.concatenate(rows, axis=0) if rows else np.zeros((0, patch_dim), np.float32)
    return pixel_values, np.asarray(grids, dtype=np.int32).reshape(-1, 3)


# --- chat ----------------------------------------------------------------------


def _compile_template(chat_template: str):
    """Compile a chat template in the environment transformers uses (sandboxed, trim/lstrip blocks)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(chat_template)


_TEMPLATE_CACHE: dict[str, Any] = {}


def render_chat(messages: Sequence[dict], add_generation_prompt: bool = True,
                chat_template: str = QWEN3_VL_CHAT_TEMPLATE, tools: Sequence[dict] | None = None) -> str:
    """Render chat messages to text with one `<|image_pad|>` per image (not yet expanded); `tools`: function
    schemas the template lists in its system turn (transformers' apply_chat_template(tools=...))."""
    if chat_template not in _TEMPLATE_CACHE:
        _TEMPLATE_CACHE[chat_template] = _compile_template(chat_template)
    return _TEMPLATE_CACHE[chat_template].render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                                 tools=list(tools) if tools else None)


def chat_pieces(messages: Sequence[dict], add_generation_prompt: bool, chat_template: str,
                tools: Sequence[dict] | None = None) -> list[str | list[int]]:
    """The rendered conversation as text pieces and, in place of each assistant message that carries TOKEN_IDS,
    those ids (its text and the <|im_end|> after it): tokenizing the texts and joining in order gives the row."""
    text = render_chat(messages, add_generation_prompt, chat_template, tools)
    pieces: list[str | list[int]] = []
    cursor = 0
    for index, message in enumerate(messages):
        ids = message.get(TOKEN_IDS) if isinstance(message, dict) else None
        if ids is None:
            continue
        if message.get("role") != "assistant" or not isinstance(message.get("content"), str):
            raise ValueError(f"message {index}: {TOKEN_IDS} only go with an assistant message whose content is text")
        start = len(render_chat(messages[:index], True, chat_template, tools))
        span = message["content"] + END_OF_TURN
        if start < cursor or text[start:start + len(span)] != span:
            raise ValueError(f"message {index}: the chat template does not render the assistant text where expected")
        pieces += [text[cursor:start], [int(i) for i in ids]]
        cursor = start + len(span)
    pieces.append(text[cursor:])
    return pieces


def count_image_parts(messages: Sequence[dict]) -> int:
    """Number of image parts in HF-style chat messages (what the template renders as image pads)."""
    count = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            count += sum(1 for part in content if isinstance(part, dict)
                         and (part.get("type") == "image" or "image" in part or "image_url" in part))
    return count


def expand_image_tokens(text: str, tokens_per_image: Sequence[int]) -> str:
    """Replace the k-th `<|image_pad|>` by tokens_per_image[k] copies, as Qwen3VLProcessor does."""
    pieces = text.split(IMAGE_PAD)
    if len(pieces) - 1 != len(tokens_per_image):
        raise ValueError(f"text has {len(pieces) - 1} {IMAGE_PAD} placeholders but {len(tokens_per_image)} images")
    out = [pieces[0]]
    for count, piece in zip(tokens_per_image, pieces[1:]):
        out.append(IMAGE_PAD * int(count))
        out.append(piece)
    return "".join(out)


# --- MRoPE positions --------------------------------------------------------------


def get_rope_index(input_ids: np.ndarray, image_grid_thw: np.ndarray | None, attention_mask: np.ndarray | None = None,
                   *, image_token_id: int, spatial_merge_size: int = MERGE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """MRoPE position ids (3, B, L) and rope deltas (B, 1), equal to HF Qwen3VLModel.get_rope_index.

    Text tokens take consecutive positions; an image's tokens take (t=s, h=s+row, w=s+col) from its
    start s, and the text after it resumes at s + max(h', w'). Padding (mask 0) gets position 0 and is
    not counted. rope_delta = max position + 1 - number of real tokens, so decode step k (0-based,
    counting real prompt tokens n) uses position n + k + delta on all three rows.
    """
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    mask = np.ones((batch, length), bool) if attention_mask is None else np.asarray(attention_mask).astype(bool)
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw, np.int64)
    position_ids = np.zeros((3, batch, length), np.int32)
    rope_deltas = np.zeros((batch, 1), np.int32)
    next_image = 0
    for b in range(batch):
        ids = input_ids[b][mask[b]]
        if ids.size == 0:
            raise ValueError(f"row {b} has no unmasked tokens")
        is_image = np.concatenate([[False], ids == image_token_id, [False]])
        edges = np.flatnonzero(is_image[1:] != is_image[:-1])
        run_starts, run_ends = edges[0::2], edges[1::2]
        rows = np.empty((3, ids.size), np.int64)
        cursor, current = 0, 0
        for start, end in zip(run_starts, run_ends):
            rows[:, cursor:start] = np.arange(start - cursor) + current
            current += start - cursor
            if next_image >= len(grids):
                raise ValueError(f"row {b}: more image-token runs than the {len(grids)} grids in image_grid_thw")
            t, h, w = (int(v) for v in grids[next_image])
            h, w = h // spatial_merge_size, w // spatial_merge_size
            if t * h * w != end - start:
                raise ValueError(f"row {b}: image {next_image} has {end - start} image tokens but its grid "
                                 f"{grids[next_image].tolist()} needs {t * h * w}")
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            rows[:, start:end] = np.stack([tt, hh, ww]).reshape(3, -1) + current
            current += max(h, w)
            cursor = end
            next_image += 1
        rows[:, cursor:] = np.arange(ids.size - cursor) + current
        position_ids[:, b, mask[b]] = rows
        rope_deltas[b, 0] = rows.max() + 1 - ids.size
    if next_image != len(grids):
        raise ValueError(f"image_grid_thw has {len(grids)} images but the input ids hold {next_image} image runs")
    return position_ids, rope_deltas


# --- batches -----------------------------------------------------------------------


def padded_length(length: int, pad_to_multiple: int | None = None, buckets: Sequence[int] | None = None) -> int:
    """Sequence length after bucketing: the smallest bucket >= length, then up to a multiple."""
    if buckets:
        fitting = [b for b in sorted(buckets) if b >= length]
        if not fitting:
            raise ValueError(f"sequence length {length} exceeds the largest bucket {max(buckets)}")
        length = fitting[0]
    if pad_to_multiple:
        length = -(-length // pad_to_multiple) * pad_to_multiple
    return length


def build_inputs(tokenizer: Any, batch_of_messages: Sequence[Sequence[dict]],
                 batch_of_images: Sequence[Sequence[Image.Image | np.ndarray]], *, min_pixels: int = HUB_MIN_PIXELS,
                 max_pixels: int = HUB_MAX_PIXELS, padding_side: str = "left", pad_to_multiple: int | None = None,
                 buckets: Sequence[int] | None = None, add_generation_prompt: bool = True,
                 chat_template: str | None = None, settings: ImageSettings | None = None,
                 batch_of_tools: Sequence[Sequence[dict] | None] | None = None) -> dict[str, np.ndarray]:
    """Chat messages + images of a batch -> padded numpy model inputs with MRoPE positions.

    `batch_of_tools`: each row's tool schemas (render_chat's `tools`), or None. An assistant message carrying
    TOKEN_IDS is encoded as those ids (chat_pieces).

    Returns input_ids, attention_mask, mm_token_type_ids (B, L) int32; pixel_values (N, 1536) float32
    (all images of all rows, in order); image_grid_thw (n, 3); position_ids (3, B, L); rope_deltas (B, 1);
    image_tokens (B,) image tokens per row; prompt_lengths (B,) unpadded lengths.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if len(batch_of_messages) != len(batch_of_images):
        raise ValueError(f"{len(batch_of_messages)} message lists but {len(batch_of_images)} image lists")
    if not batch_of_messages:
        raise ValueError("empty batch")
    s = settings or ImageSettings(min_pixels=min_pixels, max_pixels=max_pixels)
    image_token_id = _single_token_id(tokenizer, IMAGE_PAD)
    template = chat_template or getattr(tokenizer, "chat_template", None) or QWEN3_VL_CHAT_TEMPLATE
    if batch_of_tools is not None and any(batch_of_tools) and "tools" not in template:
        # Qwen2.5-VL's template has no tool section: the model would never see the tools it is asked to call
        raise ValueError("this chat template does not list tools (Qwen2.5-VL's has no tool section); an env with "
                         "tools needs a model whose template does (Qwen3-VL)")
    flat_images = [image for images in batch_of_images for image in images]
    pixel_values, grid_thw = preprocess_images(flat_images, settings=s)
    tokens_per_image = (grid_thw.prod(axis=1) // (s.merge_size ** 2)).tolist()
    if batch_of_tools is not None and len(batch_of_tools) != len(batch_of_messages):
        raise ValueError(f"{len(batch_of_messages)} message lists but {len(batch_of_tools)} tool lists")
    end_of_turn = _single_token_id(tokenizer, END_OF_TURN)
    rows_pieces, image_tokens, first = [], [], 0
    for row, (messages, images) in enumerate(zip(batch_of_messages, batch_of_images)):
        parts = count_image_parts(messages)
        if parts != len(images):
            raise ValueError(f"row {row}: messages have {parts} image parts but {len(images)} images were given")
        counts = tokens_per_image[first:first + len(images)]
        first += len(images)
        tools = batch_of_tools[row] if batch_of_tools is not None else None
        pieces = chat_pieces(messages, add_generation_prompt, template, tools)
        pads = sum(piece.count(IMAGE_PAD) for piece in pieces if isinstance(piece, str))
        if pads != len(images):
            raise ValueError(f"row {row}: the chat text holds {pads} {IMAGE_PAD} for {len(images)} "
                             f"images (does a message contain a literal {IMAGE_PAD}?)")
        expanded, used = [], 0
        for piece in pieces:
            if isinstance(piece, list):
                if not piece or piece[-1] != end_of_turn:
                    raise ValueError(f"row {row}: an assistant message's {TOKEN_IDS} must end with {END_OF_TURN}")
                expanded.append(piece)
            elif piece:
                here = piece.count(IMAGE_PAD)
                expanded.append(expand_image_tokens(piece, counts[used:used + here]))
                used += here
        rows_pieces.append(expanded)
        image_tokens.append(sum(counts))
    # one batched call: the fast tokenizer encodes the texts of the whole batch in parallel
    texts = [piece for pieces in rows_pieces for piece in pieces if isinstance(piece, str)]
    text_ids = iter(tokenizer(texts)["input_ids"] if texts else [])
    encoded = [[i for piece in pieces for i in (piece if isinstance(piece, list) else next(text_ids))]
               for pieces in rows_pieces]
    for row, ids in enumerate(encoded):
        found = sum(1 for t in ids if t == image_token_id)
        if found != image_tokens[row]:
            raise ValueError(f"row {row}: tokenizer produced {found} {IMAGE_PAD} ids, expected {image_tokens[row]}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("tokenizer has no pad_token_id; set one (Qwen uses <|endoftext|>)")
    lengths = np.asarray([len(ids) for ids in encoded], np.int32)
    length = padded_length(int(lengths.max()), pad_to_multiple, buckets)
    input_ids = np.full((len(encoded), length), pad_id, np.int32)
    attention_mask = np.zeros((len(encoded), length), np.int32)
    for row, ids in enumerate(encoded):
        span = slice(length - len(ids), length) if padding_side == "left" else slice(0, len(ids))
        input_ids[row, span] = ids
        attention_mask[row, span] = 1
    mm_token_type_ids = ((input_ids == image_token_id) & (attention_mask == 1)).astype(np.int32)
    position_ids, rope_deltas = get_rope_index(input_ids, grid_thw, attention_mask, image_token_id=image_token_id,
                                               spatial_merge_size=s.merge_size)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "mm_token_type_ids": mm_token_type_ids,
            "pixel_values": pixel_values, "image_grid_thw": grid_thw, "position_ids": position_ids,
            "rope_deltas": rope_deltas, "image_tokens": np.asarray(image_tokens, np.int32), "prompt_lengths": lengths}


def _single_token_id(tokenizer: Any, token: str) -> int:
    """The id of a special token, checking that the tokenizer keeps it as one token."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"tokenizer splits {token} into {len(ids)} ids; it must be a single special token")
    return int(ids[0])


# --- one object for the stages --------------------------------------------------------


def read_image_settings(path: str | Path) -> ImageSettings:
    """ImageSettings from a preprocessor_config.json (hub `size` or legacy min/max_pixels keys)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read preprocessor config: {err}") from err
    size = raw.get("size") or {}
    min_pixels = raw.get("min_pixels", size.get("shortest_edge", HUB_MIN_PIXELS))
    max_pixels = raw.get("max_pixels", size.get("longest_edge", HUB_MAX_PIXELS))
    return ImageSettings(min_pixels=int(min_pixels), max_pixels=int(max_pixels),
                         patch_size=int(raw.get("patch_size", PATCH_SIZE)),
                         temporal_patch_size=int(raw.get("temporal_patch_size", TEMPORAL_PATCH_SIZE)),
                         merge_size=int(raw.get("merge_size", MERGE_SIZE)),
                         image_mean=tuple(raw.get("image_mean", IMAGE_MEAN)),
                         image_std=tuple(raw.get("image_std", IMAGE_STD)),
                         rescale_factor=float(raw.get("rescale_factor", RESCALE_FACTOR)))


def image_processor_config(settings: ImageSettings, processor_class: str = "Qwen3VLProcessor") -> dict[str, Any]:
    """A preprocessor_config.json dict in the hub layout for these settings (Qwen2.5-VL's names processor_class
    Qwen2_5_VLProcessor; the image processor is the same class)."""
    return {"image_processor_type": "Qwen2VLImageProcessor", "processor_class": processor_class,
            "do_convert_rgb": True, "do_resize": True, "resample": 3, "do_rescale": True,
            "rescale_factor": settings.rescale_factor, "do_normalize": True,
            "image_mean": list(settings.image_mean), "image_std": list(settings.image_std),
            "size": {"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
            "patch_size": settings.patch_size, "temporal_patch_size": settings.temporal_patch_size,
            "merge_size": settings.merge_size}


class Processor:
    """Tokenizer + image settings + chat template of one checkpoint folder: the one thing stages call."""

    def __init__(self, tokenizer: Any, settings: ImageSettings, chat_template: str | None = None,
                 eos_token_ids: Sequence[int] | None = None):
        self.tokenizer = tokenizer
        self.settings = settings
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None) or QWEN3_VL_CHAT_TEMPLATE
        self.image_token_id = _single_token_id(tokenizer, IMAGE_PAD)
        self.vision_start_token_id = _single_token_id(tokenizer, VISION_START)
        self.vision_end_token_id = _single_token_id(tokenizer, VISION_END)
        self.pad_token_id = tokenizer.pad_token_id
        self.eos_token_ids = list(eos_token_ids or [tokenizer.eos_token_id])

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> Processor:
        """Load from an HF checkpoint folder (tokenizer files + preprocessor_config.json), offline."""
        model_dir = Path(model_dir)
        config = model_dir / "preprocessor_config.json"
        if not config.exists():
            raise FileNotFoundError(f"{model_dir}: no preprocessor_config.json (is this a Qwen3-VL checkpoint?)")
        tokenizer = load_tokenizer(model_dir)
        template = getattr(tokenizer, "chat_template", None) or _template_from_folder(model_dir)
        return cls(tokenizer, read_image_settings(config), template, _eos_from_folder(model_dir))

    def __call__(self, batch_of_messages: Sequence[Sequence[dict]],
                 batch_of_images: Sequence[Sequence[Image.Image | np.ndarray]], *, padding_side: str = "left",
                 pad_to_multiple: int | None = None, buckets: Sequence[int] | None = None,
                 add_generation_prompt: bool = True,
                 batch_of_tools: Sequence[Sequence[dict] | None] | None = None) -> dict[str, np.ndarray]:
        """build_inputs with this checkpoint's tokenizer, pixel budget and chat template."""
        return build_inputs(self.tokenizer, batch_of_messages, batch_of_images, padding_side=padding_side,
                            pad_to_multiple=pad_to_multiple, buckets=buckets,
                            add_generation_prompt=add_generation_prompt, chat_template=self.chat_template,
                            settings=self.settings, batch_of_tools=batch_of_tools)

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True,
               tools: Sequence[dict] | None = None) -> str:
        """The chat text of one conversation, image pads not expanded."""
        return render_chat(messages, add_generation_prompt, self.chat_template, tools)

    def num_image_tokens(self, height: int, width: int) -> int:
        """LLM tokens an image of this size becomes under this checkpoint's pixel budget."""
        return self.settings.num_image_tokens(height, width)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)


def load_tokenizer(model_dir: Path) -> Any:
    """The folder's tokenizer, as AutoTokenizer loads it. The Qwen class (Qwen2Tokenizer, which AutoTokenizer takes
    from tokenizer_config.json for model_type qwen3_vl, qwen2_5_vl or a folder without config.json) is imported
    directly: AutoTokenizer's config machinery imports torch (~2 s), which the JAX stages that only tokenize never
    need. Any other class or model type goes through AutoTokenizer."""
    try:
        named = json.loads((model_dir / "tokenizer_config.json").read_text()).get("tokenizer_class")
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        named = model_type = None
    if named == "Qwen2Tokenizer" and model_type in (None, "qwen3_vl", "qwen2_5_vl"):
        from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

        return Qwen2Tokenizer.from_pretrained(str(model_dir), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def _template_from_folder(model_dir: Path) -> str | None:
    """A chat template stored beside the tokenizer (chat_template.jinja or chat_template.json)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    as_json = model_dir / "chat_template.json"
    if as_json.exists():
        return json.loads(as_json.read_text()).get("chat_template")
    return None


def _eos_from_folder(model_dir: Path) -> list[int] | None:
    """The stop ids of generation_config.json (Qwen: <|im_end|> and <|endoftext|>), if the folder has one."""
    path = model_dir / "generation_config.json"
    if not path.exists():
        return None
    eos = json.loads(path.read_text()).get("eos_token_id")
    return None if eos is None else [int(i) for i in (eos if isinstance(eos, list) else [eos])]
