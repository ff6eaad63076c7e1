"""Group rollouts: prefill each prompt once, share its KV cache across its samples, decode in one jitted loop.

    engine = RolloutEngine(cfg, processor, SamplingSettings(max_new_tokens=64, temperature=1.0, eos_ids=(...)))
    batch = engine.generate(params, obs_list, group_size=8, key=jax.random.key(0))
    batch.completion_ids, batch.completion_mask, batch.logprobs      # what the learner needs
    token_logprobs(params, cfg, batch.sequence_inputs(), batch.completion_ids, batch.completion_mask,
                   temperature=settings.logprob_temperature)         # == batch.logprobs (on-policy)

With `devices=[...]` the prompts are split over the devices, each share prefilled and decoded in its own thread;
on a CPU with one fake host device per core (`--xla_force_host_platform_device_count`) that runs one decode loop
per core, where one loop alone keeps a single core busy.

Rows are prompt-major: completion row r answers prompt r // group_size. Shapes are bucketed (number of
prompts, prompt length, image patches) so a training run compiles a handful of times; every trace of the
jitted functions is logged and counted in `TRACE_COUNTS`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vlmgym.models.family import family_of
from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.model import prefill
from vlmgym.models.qwen3_vl.weights import Params
from vlmgym.rollout.decode import GroupCache, decoder_layers, group_cache, group_decode_step, lm_head_kernel
from vlmgym.rollout.sampling import SamplingSettings, sample_tokens, seed_from_key

# Observation lists whose processor inputs an engine keeps after prepare_ahead (the next step's, and one spare).
PREPARED_KEPT = 2

log = logging.getLogger(__name__)

# How often each jitted rollout function has been traced (= compiled) in this process.
TRACE_COUNTS: Counter[str] = Counter()


def _note_trace(name: str, **shapes: Any) -> None:
    """Runs only while JAX traces (a Python side effect), so it counts and logs compiles, never calls."""
    TRACE_COUNTS[name] += 1
    detail = " ".join(f"{k}={v}" for k, v in shapes.items())
    log.info("compiling rollout %s (#%d in this process): %s", name, TRACE_COUNTS[name], detail)


@dataclass(frozen=True)
class Buckets:
    """Static-shape ladders: each dimension is padded up to the smallest entry that fits it."""

    prompt_lengths: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    num_prompts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    min_patches: int = 64  # patch counts are padded to a power of two, at least this

    def fit(self, ladder: tuple[int, ...], value: int, what: str) -> int:
        """The smallest ladder entry >= value."""
        for size in ladder:
            if size >= value:
                return size
        raise ValueError(f"{what} {value} exceeds the largest bucket {ladder[-1]}; extend Buckets")

    def patches(self, value: int) -> int:
        """Patch-axis bucket: the next power of two, at least min_patches."""
        return max(self.min_patches, _next_power_of_two(value))


def _next_power_of_two(value: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(value, 1))))


def bucketed_patch_layout(cfg: Qwen3VLConfig, grid_thw: np.ndarray, pad_to: int) -> dict[str, np.ndarray]:
    """The family's patch_layout with its attention blocks padded too: (blocks, longest block) rounded up to powers
    of two (blocks: image frames, and Qwen2.5-VL's attention windows).

    The layout gathers each block's patches into a row of an index array (padded with the past-the-end index,
    masked by its valid array) and scatters results back through a slot array = block * longest + offset; empty
    extra rows and columns change no output, while their shapes no longer depend on the image mix.
    """
    family = family_of(cfg)
    layout = family.patch_layout(cfg, grid_thw, pad_to=pad_to)
    for index_key, valid_key, slot_key in family.layout_blocks:
        index, slot = layout[index_key], layout[slot_key]
        blocks, longest = index.shape
        new_blocks, new_longest = _next_power_of_two(blocks), _next_power_of_two(longest)
        past_end = len(slot)
        padded = np.full((new_blocks, new_longest), past_end, index.dtype)
        padded[:blocks, :longest] = index
        layout = {**layout, index_key: padded, valid_key: padded < past_end,
                  slot_key: ((slot // longest) * new_longest + slot % longest).astype(slot.dtype)}
    return layout


@dataclass
class RolloutBatch:
    """group_size completions for each of num_prompts prompts; per-token arrays are (num_prompts*group_size, T)."""

    prompt_inputs: dict[str, np.ndarray]  # processor output for the prompts (left-padded, length-bucketed)
    group_size: int
    completion_ids: np.ndarray  # int32, pad_id after the end
    completion_mask: np.ndarray  # float32: 1 up to and including the first EOS, 0 after
    logprobs: np.ndarray  # float32: full softmax at logprob_temperature (what the learner computes); 0 where masked
    sample_logprobs: np.ndarray  # float32: under the distribution sampled from (0 for greedy); 0 where masked
    lengths: np.ndarray  # int32: completion tokens counted (EOS included)
    finish_reasons: list[str]  # "eos" or "length"
    texts: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    cfg: Qwen3VLConfig | None = None  # needed to lay out repeated images in sequence_inputs

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_inputs["input_ids"].shape[0])

    @property
    def prompt_index(self) -> np.ndarray:
        """The prompt each completion row answers."""
        return np.repeat(np.arange(self.num_prompts), self.group_size)

    def sequence_inputs(self, patch_bucket: Buckets | None = None) -> dict[str, np.ndarray]:
        """Prompt inputs repeated per completion row, with the vision patch layout: `token_logprobs`' `inputs`."""
        return repeat_prompt_inputs(self.prompt_inputs, self.group_size, self.cfg, patch_bucket)


def repeat_prompt_inputs(inputs: dict[str, np.ndarray], group_size: int, cfg: Qwen3VLConfig | None,
                         buckets: Buckets | None = None) -> dict[str, np.ndarray]:
    """Repeat every prompt row group_size times (and its images), adding the vision patch layout."""
    out = {key: np.repeat(inputs[key], group_size, axis=0)
           for key in ("input_ids", "attention_mask", "mm_token_type_ids", "rope_deltas") if key in inputs}
    out["position_ids"] = np.repeat(inputs["position_ids"], group_size, axis=1)
    grids = np.asarray(inputs.get("image_grid_thw", np.zeros((0, 3))), np.int64)
    if len(grids):
        if cfg is None:
            raise ValueError("repeating images needs the model config (for the patch layout)")
        pixels = np.asarray(inputs["pixel_values"])
        first_image, first_patch = _image_bounds(inputs, cfg)
        rows_pixels, rows_grids = [], []
        for row in range(len(first_image) - 1):
            span = slice(first_image[row], first_image[row + 1])
            row_pixels = pixels[first_patch[span.start]:first_patch[span.stop]]
            for _ in range(group_size):
                rows_pixels.append(row_pixels)
                rows_grids.append(grids[span])
        out["pixel_values"] = np.concatenate(rows_pixels)
        out["image_grid_thw"] = np.concatenate(rows_grids).astype(np.int32)
        pad_to = (buckets or Buckets()).patches(len(out["pixel_values"]))
        out["pixel_values"] = _pad_rows(out["pixel_values"], pad_to)
        out["patch_layout"] = bucketed_patch_layout(cfg, out["image_grid_thw"], pad_to)
    return out


def slice_prompts(inputs: dict[str, np.ndarray], start: int, stop: int,
                  cfg: Qwen3VLConfig | None) -> dict[str, np.ndarray]:
    """Prompt rows start..stop of processor inputs, with their images (padding length unchanged)."""
    out = {key: value[start:stop] for key, value in inputs.items()
           if key not in ("position_ids", "pixel_values", "image_grid_thw")}
    out["position_ids"] = inputs["position_ids"][:, start:stop]
    grids = np.asarray(inputs.get("image_grid_thw", np.zeros((0, 3))), np.int64)
    if len(grids):
        if cfg is None:
            raise ValueError("slicing prompts with images needs the model config")
        first_image, first_patch = _image_bounds(inputs, cfg)
        images = slice(first_image[start], first_image[stop])
        out["image_grid_thw"] = inputs["image_grid_thw"][images]
        out["pixel_values"] = inputs["pixel_values"][first_patch[images.start]:first_patch[images.stop]]
    return out


def _image_bounds(inputs: dict[str, np.ndarray], cfg: Qwen3VLConfig) -> tuple[np.ndarray, np.ndarray]:
    """(first image of each prompt row, first patch row of each image), each ending with a past-the-end entry."""
    grids = np.asarray(inputs["image_grid_thw"], np.int64)
    first_image = np.concatenate([[0], np.cumsum(_images_per_row(inputs, cfg))])
    return first_image, np.concatenate([[0], np.cumsum(grids.prod(axis=1))])


def _images_per_row(inputs: dict[str, np.ndarray], cfg: Qwen3VLConfig) -> np.ndarray:
    """How many images each prompt row holds (count of image-token runs)."""
    is_image = (np.asarray(inputs["input_ids"]) == cfg.image_token_id) & (np.asarray(inputs["attention_mask"]) == 1)
    starts = is_image[:, 1:] & ~is_image[:, :-1]
    return (starts.sum(axis=1) + is_image[:, 0]).astype(np.int64)


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """Zero-pad the leading axis to `rows`."""
    if array.shape[0] >= rows:
        return array
    return np.concatenate([array, np.zeros((rows - array.shape[0],) + array.shape[1:], array.dtype)])


def _pad_prompt_batch(inputs: dict[str, np.ndarray], num_rows: int, pad_id: int) -> dict[str, np.ndarray]:
    """Add dummy prompts (one attended pad token, no image) up to num_rows; their samples are discarded."""
    extra = num_rows - inputs["input_ids"].shape[0]
    if extra <= 0:
        return inputs
    length = inputs["input_ids"].shape[1]
    out = dict(inputs)
    out["input_ids"] = np.concatenate([inputs["input_ids"], np.full((extra, length), pad_id, np.int32)])
    dummy_mask = np.zeros((extra, length), np.int32)
    dummy_mask[:, -1] = 1
    out["attention_mask"] = np.concatenate([inputs["attention_mask"], dummy_mask])
    out["position_ids"] = np.concatenate([inputs["position_ids"], np.zeros((3, extra, length), np.int32)], axis=1)
    return out


@partial(jax.jit, static_argnames=("cfg", "group_size", "max_new_tokens"))
def _prefill_group(params: Params, cfg: Qwen3VLConfig, prompts: dict[str, jax.Array], group_size: int,
                   max_new_tokens: int) -> tuple[jax.Array, GroupCache]:
    """Vision + prompt forward once per prompt; last logits repeated per sample, the prompt cache kept once."""
    _note_trace("prefill", batch=prompts["input_ids"].shape, patches=prompts.get("pixel_values", np.zeros(0)).shape,
                group_size=group_size, max_new_tokens=max_new_tokens, dtype=cfg.dtype)
    image_embeds = deepstack_embeds = None
    if "pixel_values" in prompts:
        image_embeds, deepstack_embeds = family_of(cfg).encode(params, cfg, prompts["pixel_values"],
                                                                prompts["patch_layout"])
    logits, cache = prefill(params, cfg, prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"],
                            image_embeds, deepstack_embeds, cache_size=prompts["input_ids"].shape[1])
    return jnp.repeat(logits, group_size, axis=0), group_cache(cfg, cache, group_size, max_new_tokens)


@partial(jax.jit, static_argnames=("cfg", "settings"), donate_argnames=("cache",))
def _decode_loop(params: Params, cfg: Qwen3VLConfig, settings: SamplingSettings, logits: jax.Array,
                 cache: GroupCache, key: jax.Array, live: jax.Array,
                 first_row: jax.Array) -> tuple[dict[str, jax.Array], GroupCache]:
    """Sample up to max_new_tokens per row inside one lax.while_loop; stops early once every live row ended.

    first_row: the batch-wide id of this call's first row (the sampler's counter), so a part of a batch run on
    another device draws what those rows draw in the whole batch.
    """
    _note_trace("decode", logits=logits.shape, prompt_cache=cache["prompt_k"][0].shape, settings=settings)
    batch, steps = logits.shape[0], settings.max_new_tokens
    seed = seed_from_key(key)
    rows = first_row.astype(jnp.uint32) + jnp.arange(batch, dtype=jnp.uint32)
    eos = jnp.asarray(settings.eos_ids or (-1,), jnp.int32)
    lm_head = lm_head_kernel(params, cfg)
    layers = decoder_layers(params, cfg)

    def sample(step_logits: jax.Array, step: jax.Array, done: jax.Array, out: dict[str, jax.Array]):
        tokens, sample_lp, policy_lp = sample_tokens(step_logits, seed, rows, step, settings)
        tokens = jnp.where(done, settings.pad_id, tokens)
        out = {
            "tokens": out["tokens"].at[:, step].set(tokens),
            "logprobs": out["logprobs"].at[:, step].set(jnp.where(done, 0.0, policy_lp)),
            "sample_logprobs": out["sample_logprobs"].at[:, step].set(jnp.where(done, 0.0, sample_lp)),
            "mask": out["mask"].at[:, step].set(~done),
        }
        ended = ~done & jnp.isin(tokens, eos)
        return tokens, done | ended, out, ended

    out = {"tokens": jnp.full((batch, steps), settings.pad_id, jnp.int32),
           "logprobs": jnp.zeros((batch, steps), jnp.float32),
           "sample_logprobs": jnp.zeros((batch, steps), jnp.float32),
           "mask": jnp.zeros((batch, steps), bool)}
    tokens, done, out, eos_hit = sample(logits, jnp.int32(0), ~live, out)

    def cond(state):
        step, _, done, _, _, _ = state
        return (step < steps) & ~jnp.all(done)

    def body(state):
        step, tokens, done, eos_hit, out, cache = state
        # Feed the token sampled at step - 1 (its KV goes to generated slot step - 1), sample token `step`.
        step_logits, cache = group_decode_step(params, cfg, layers, tokens, step - 1, cache, lm_head)
        tokens, done, out, ended = sample(step_logits, step, done, out)
        return step + 1, tokens, done, eos_hit | ended, out, cache

    _, _, _, eos_hit, out, cache = lax.while_loop(cond, body, (jnp.int32(1), tokens, done, eos_hit, out, cache))
    out["eos"] = eos_hit
    return out, cache


class RolloutEngine:
    """Samples groups of completions for env observations (`{"images": [...], "messages": [...]}`, optionally
    `"tools"`: the function schemas a multi-turn env offers, vlmgym.rollout.episodes).

    devices: run the prompts split over these devices, each part in its own thread (XLA:CPU runs one decode loop
    on one core, so on a CPU with fake host devices, `--xla_force_host_platform_device_count`, each core decodes
    a share of the prompts). Default: the default device. Rows draw the same random numbers either way.
    """

    def __init__(self, cfg: Qwen3VLConfig, processor: Any, settings: SamplingSettings,
                 buckets: Buckets = Buckets(), devices: Sequence[Any] | None = None):
        self.cfg = cfg
        self.processor = processor
        self.settings = settings
        self.buckets = buckets
        self.devices = tuple(devices or ())
        self._replicas: dict[Any, tuple[list[Any], Params]] = {}
        self._pool: ThreadPoolExecutor | None = None
        # Inputs prepared ahead (prepare_ahead) for observation lists not asked for yet; one lock around the
        # processor, as a fast tokenizer must not encode in two threads at once.
        self._prepared: list[tuple[list[dict[str, Any]], dict[str, np.ndarray]]] = []
        self._processing = threading.Lock()

    def prepare_ahead(self, obs_list: Sequence[dict[str, Any]]) -> None:
        """Run the processor for `obs_list` now (e.g. in a data thread); `prepare` of the same observation objects,
        in the same order, then returns the result without processing them again."""
        inputs = self._process(obs_list)
        with self._processing:
            self._prepared = [*self._prepared[-(PREPARED_KEPT - 1):], (list(obs_list), inputs)]

    def prepare(self, obs_list: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        """Observations -> left-padded, length-bucketed processor inputs."""
        with self._processing:
            for listed, inputs in self._prepared:
                if len(listed) == len(obs_list) and all(a is b for a, b in zip(listed, obs_list)):
                    return inputs
        return self._process(obs_list)

    def _process(self, obs_list: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        if self.processor is None:
            raise ValueError("RolloutEngine needs a processor to turn observations into token ids")
        for index, obs in enumerate(obs_list):
            if not isinstance(obs, dict) or "messages" not in obs:
                raise ValueError(f"observation {index}: expected a dict with 'messages' (and 'images'), got {obs!r}")
        # an observation's "tools" (function schemas) are listed in its system turn; passed only when some row has
        # them, so a processor that knows no tools still serves single-turn envs
        tools = [o.get("tools") for o in obs_list]
        extra = {"batch_of_tools": tools} if any(tools) else {}
        with self._processing:
            return self.processor([o["messages"] for o in obs_list], [list(o.get("images") or []) for o in obs_list],
                                  padding_side="left", buckets=self.buckets.prompt_lengths, **extra)

    def generate(self, params: Params, obs_list: Sequence[dict[str, Any]], group_size: int,
                 key: jax.Array, first_row: int = 0) -> RolloutBatch:
        """group_size completions for each observation."""
        return self.generate_from_inputs(params, self.prepare(obs_list), group_size, key, first_row)

    def generate_from_inputs(self, params: Params, inputs: dict[str, np.ndarray], group_size: int,
                             key: jax.Array, first_row: int = 0) -> RolloutBatch:
        """group_size completions for each row of left-padded processor inputs.

        Row r's sampling key is `key` folded with first_row + r, so a batch split into parts (over devices here,
        over processes by the trainer) draws what the whole batch would."""
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        if inputs["attention_mask"][:, -1].min() == 0:
            raise ValueError("prompts must be left-padded (every row's last token attended)")
        start = time.perf_counter()
        num_prompts = int(inputs["input_ids"].shape[0])
        parts = self._parts(num_prompts)
        if len(parts) == 1:
            results = [self._generate_part(params, inputs, group_size, key, first_row, parts[0][0])]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="vlmgym-rollout")
            futures = [self._pool.submit(self._generate_part, params, slice_prompts(inputs, first, stop, self.cfg),
                                         group_size, key, first_row + first * group_size, device)
                       for device, first, stop in parts]
            results = [future.result() for future in futures]
        hosts, part_texts, prefills = zip(*results)
        host = {name: np.concatenate([part[name] for part in hosts]) for name in hosts[0]}
        texts = [text for part in part_texts for text in part]
        total_s = time.perf_counter() - start
        prefill_s = max(prefills)
        mask = host["mask"]
        ids = host["tokens"]
        lengths = mask.sum(axis=1).astype(np.int32)
        finish = ["eos" if hit else "length" for hit in host["eos"]]
        return RolloutBatch(
            prompt_inputs=inputs, group_size=group_size, completion_ids=ids, completion_mask=mask.astype(np.float32),
            logprobs=host["logprobs"], sample_logprobs=host["sample_logprobs"], lengths=lengths,
            finish_reasons=finish, texts=texts,
            timings={"prefill_s": prefill_s, "total_s": total_s, "decode_s": total_s - prefill_s}, cfg=self.cfg)

    def _parts(self, num_prompts: int) -> list[tuple[Any, int, int]]:
        """(device, first prompt, end) per part: contiguous, near-equal shares; one part without devices."""
        if not self.devices:
            return [(None, 0, num_prompts)]
        count = min(len(self.devices), num_prompts)
        bounds = [round(i * num_prompts / count) for i in range(count + 1)]
        return [(self.devices[i], bounds[i], bounds[i + 1]) for i in range(count)]

    def _on_device(self, params: Params, device: Any) -> Params:
        """params placed on device; the copy is kept while the same arrays come back (eval, benchmarks)."""
        leaves = jax.tree.leaves(params)
        cached = self._replicas.get(device)
        if cached is not None and len(cached[0]) == len(leaves) and all(a is b for a, b in zip(cached[0], leaves)):
            return cached[1]
        replica = jax.device_put(params, device)
        self._replicas[device] = (leaves, replica)
        return replica

    def _generate_part(self, params: Params, inputs: dict[str, np.ndarray], group_size: int, key: jax.Array,
                       first_row: int, device: Any) -> tuple[dict[str, np.ndarray], list[str], float]:
        """Prefill + decode loop for some prompts on one device: host arrays and texts of their real rows, and the
        prefill seconds. Host arrays go to the jitted calls as they are (they follow the committed params, which
        is cheaper than placing them first)."""
        start = time.perf_counter()
        prompts, num_prompts = self._device_prompts(inputs)
        live = np.zeros(prompts["input_ids"].shape[0] * group_size, bool)
        live[:num_prompts * group_size] = True
        if device is not None:
            params = self._on_device(params, device)
            key = jax.device_put(key, device)
        logits, cache = _prefill_group(params, self.cfg, prompts, group_size, self.settings.max_new_tokens)
        logits.block_until_ready()
        prefill_s = time.perf_counter() - start
        out, _ = _decode_loop(params, self.cfg, self.settings, logits, cache, key, live, np.int32(first_row))
        rows = num_prompts * group_size
        host = {name: value[:rows] for name, value in jax.device_get(out).items()}
        lengths = host["mask"].sum(axis=1)
        texts = [] if self.processor is None else self.processor.tokenizer.batch_decode(
            [host["tokens"][r, :lengths[r]].tolist() for r in range(rows)], skip_special_tokens=True)
        return host, texts, prefill_s

    def _device_prompts(self, inputs: dict[str, np.ndarray]) -> tuple[dict[str, Any], int]:
        """Pad the prompt batch and the patch axis to their buckets; the arrays the jitted prefill takes."""
        num_prompts = int(inputs["input_ids"].shape[0])
        pad_id = self.settings.pad_id
        padded = _pad_prompt_batch(inputs, self.buckets.fit(self.buckets.num_prompts, num_prompts, "prompt count"),
                                   pad_id)
        prompts: dict[str, Any] = {"input_ids": padded["input_ids"].astype(np.int32),
                                   "attention_mask": padded["attention_mask"].astype(np.int32),
                                   "position_ids": padded["position_ids"].astype(np.int32)}
        grids = np.asarray(inputs.get("image_grid_thw", np.zeros((0, 3))))
        if len(grids):
            pixels = np.asarray(inputs["pixel_values"], np.float32)
            pad_to = self.buckets.patches(pixels.shape[0])
            prompts["pixel_values"] = _pad_rows(pixels, pad_to)
            prompts["patch_layout"] = bucketed_patch_layout(self.cfg, grids, pad_to)
        return prompts, num_prompts
