"""The model as a trainable Policy: the rollout engine samples, `token_logprobs` scores, the processor encodes.

Either model family (vlmgym.models.family): the decoder is shared and the vision tower is cfg's family's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vlmgym.models.family import family_of
from vlmgym.models.qwen3_vl import lora
from vlmgym.models.qwen3_vl.chat import END_OF_TURN
from vlmgym.models.qwen3_vl.config import Qwen3VLConfig
from vlmgym.models.qwen3_vl.mesh import batch_sharding
from vlmgym.models.qwen3_vl.model import token_logprobs
from vlmgym.models.qwen3_vl.shared_prefix import shared_prefix_logprobs
from vlmgym.rl.loop import Samples
from vlmgym.rollout.engine import TRACE_COUNTS, Buckets, RolloutEngine
from vlmgym.rollout.episodes import Advance, EpisodeBatch, run_episodes
from vlmgym.rollout.sampling import SamplingSettings
from vlmgym.runtime import distributed

LEARNER_KEYS = ("input_ids", "attention_mask", "position_ids", "pixel_values", "patch_layout")
REMAT_CHOICES = ("none", "layer")  # train.remat / sft.remat


def learner_batch_shardings(batch: dict, mesh: Mesh) -> dict:
    """Where a learner batch (`Qwen3VLPolicy.build_batch`'s layout) lives on `mesh`: prompt arrays split over the
    data axes by prompt, completion arrays by row (a group's rows are consecutive, so sharding prompts and rows
    alike keeps each group on one device), image patches replicated. A tree of NamedSharding parallel to `batch`
    (its leaves may be arrays or jax.ShapeDtypeStruct)."""
    rows, prompts = batch["completion_ids"].shape[0], batch["inputs"]["input_ids"].shape[0]
    replicated = NamedSharding(mesh, PartitionSpec())

    def where(path: tuple, x: Any) -> NamedSharding:
        name = getattr(path[-1], "key", "")
        ndim = len(x.shape)
        if name == "position_ids":  # (3, prompts, length)
            return batch_sharding(mesh, ndim, 1, prompts)
        if name in ("input_ids", "attention_mask"):
            return batch_sharding(mesh, ndim, 0, prompts)
        if path[0].key != "inputs":
            return batch_sharding(mesh, ndim, 0, rows)
        return replicated  # image patches are not laid out per row

    return jax.tree_util.tree_map_with_path(where, batch)


# Only the adapted kernels go through the jit: its outputs are new buffers, so the rest of the base stays shared.
_merged_kernels = jax.jit(lambda denses: {key: lora.merged_kernel(dense) for key, dense in denses.items()})


def sampling_params(params: Any) -> Any:
    """What the rollout engine decodes with: LoRA adapters merged into their kernels once per sampling call.

    Measured against applying the adapters in every decode step (BENCHMARKS.md, "LoRA rollout"): merging is
    faster on the tiny model (0.287 s vs 0.336 s per call, the merge 1.3 ms of it) and moves ~0.4% of a 4B rollout
    phase's bytes, at the cost of a transient merged copy of the adapted kernels (7.3 GB bf16 for 4B at any rank)
    while sampling. Without adapters the params pass through untouched."""
    if not lora.has_adapters(params):
        return params
    return lora.with_kernels(params, _merged_kernels(lora.adapted_denses(params)))


class Qwen3VLLearner:
    """The learner half of the policy: log-probs (and features) of a learner batch, and its placement on a mesh.

    Needs no tokenizer: `vlmgym plan` compiles the trainer's update with it for a real config's shapes.
    `remat`: "layer" recomputes each decoder layer's and vision block's activations in the backward pass
    (jax.checkpoint around every scanned layer) instead of keeping them; the gradients are the same.
    """

    def __init__(self, cfg: Qwen3VLConfig, settings: SamplingSettings, *, mesh: Mesh | None = None,
                 share_prefix: bool = True, remat: str = "none"):
        if remat not in REMAT_CHOICES:
            raise ValueError(f"remat={remat!r}: expected one of {REMAT_CHOICES}")
        self.cfg, self.settings, self.mesh = cfg, settings, mesh
        self.share_prefix, self.remat = share_prefix, remat

    @property
    def feature_size(self) -> int:
        """Width of the features `logprobs_and_features` returns (the text hidden size)."""
        return self.cfg.text.hidden_size

    def _with_patch_layout(self, inputs: dict) -> dict:
        # Pad the patches to a multiple of the longest image rather than the engine's power-of-two bucket: a
        # per-copy learner batch holds group_size copies of each image, so power-of-two padding could add ~1k
        # patches of vision work per step; the shape still stays fixed while the images keep their size.
        grids = np.asarray(inputs["image_grid_thw"], np.int64)
        frame = int((grids[:, 1] * grids[:, 2]).max())
        pixels = np.asarray(inputs["pixel_values"])
        total = -(-len(pixels) // frame) * frame
        padding = np.zeros((total - len(pixels), pixels.shape[1]), pixels.dtype)
        return {**inputs, "pixel_values": np.concatenate([pixels, padding]),
                "patch_layout": family_of(self.cfg).patch_layout(self.cfg, grids, pad_to=total)}

    def _place(self, batch: dict) -> dict:
        return distributed.put_global(batch, learner_batch_shardings(batch, self.mesh))

    def logprobs(self, params: Any, batch: dict) -> jax.Array:
        """Log-probs of the completion tokens [batch, max_new_tokens] at the sampling temperature (0 where masked)."""
        return self._score(params, batch, with_features=False)

    def logprobs_and_features(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        """`logprobs` and the final-normed hidden state that predicts each token [batch, max_new_tokens, hidden]
        (float32): what a PPO value head reads."""
        return self._score(params, batch, with_features=True)

    def logprobs_and_entropies(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        """`logprobs` and each position's entropy of the same tempered softmax [batch, max_new_tokens] (0 where
        masked): what train.objective.top_entropy_quantile ranks tokens by."""
        return self._score(params, batch, with_features=False, with_entropy=True)

    def _score(self, params: Any, batch: dict, with_features: bool, with_entropy: bool = False) -> Any:
        score = (shared_prefix_logprobs if batch["completion_ids"].shape[0] != batch["inputs"]["input_ids"].shape[0]
                 else token_logprobs)
        return score(params, self.cfg, batch["inputs"], batch["completion_ids"], batch["completion_mask"],
                     remat=self.remat == "layer", temperature=self.settings.logprob_temperature,
                     with_features=with_features, with_entropy=with_entropy)


class Qwen3VLPolicy(Qwen3VLLearner):
    """Samples with the rollout engine and recomputes the same log-probs (softmax at the sampling temperature)
    with the learner.

    Hashed by identity: it is a static argument of the trainer's jitted functions, created once per run.
    With a `mesh`, learner batches are placed batch-sharded over its data axes (parameters are placed by
    the caller with `sharding.shard_params`), so one code path runs on one device or many.
    With `share_prefix` (the default) a batch given one observation per group of completions runs each prompt
    once (`shared_prefix.shared_prefix_logprobs`); without it every completion gets its own copy of the prompt
    (`model.token_logprobs`, the reference the shared forward is tested against). `remat`: see Qwen3VLLearner.
    """

    def __init__(self, cfg: Qwen3VLConfig, processor: Any, settings: SamplingSettings, *,
                 buckets: Buckets | None = None, mesh: Mesh | None = None, share_prefix: bool = True,
                 remat: str = "none"):
        super().__init__(cfg, settings, mesh=mesh, share_prefix=share_prefix, remat=remat)
        end_of_turn = processor.tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if end_of_turn is None or end_of_turn not in settings.eos_ids:
            raise ValueError(f"sampling eos_ids {settings.eos_ids} must include {END_OF_TURN} ({end_of_turn}), "
                             "the token that ends an assistant turn")
        self.processor = processor
        self.buckets = buckets or Buckets()
        self.engine = RolloutEngine(cfg, processor, settings, self.buckets)
        self.end_of_turn = int(end_of_turn)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.settings.eos_ids

    @property
    def max_new_tokens(self) -> int:
        return self.settings.max_new_tokens

    @property
    def compile_count(self) -> int:
        """Traces of the rollout engine's jitted functions in this process (the trainer counts its own)."""
        return sum(TRACE_COUNTS.values())

    def sample(self, params: Any, observations: Sequence[dict], group_size: int, rng: jax.Array,
               first_row: int = 0) -> Samples:
        """group_size completions per observation from the rollout engine (tempered-softmax log-probs kept).

        `first_row`: the batch-wide row id of the first completion (a process sampling its share of a batch draws
        what one process sampling the whole batch would). Params spread over several processes are sampled with
        this process's copy."""
        batch = self.engine.generate(sampling_params(distributed.local_copy(params)), observations, group_size, rng,
                                     first_row)
        return Samples(tokens=batch.completion_ids, mask=batch.completion_mask, logprobs=batch.logprobs,
                       texts=list(batch.texts))

    def sample_episodes(self, params: Any, observations: Sequence[dict], group_size: int, rng: jax.Array,
                        advance: Advance, max_turns: int, first_row: int = 0) -> EpisodeBatch:
        """group_size multi-turn episodes per observation (vlmgym.rollout.episodes.run_episodes)."""
        return run_episodes(self.engine, sampling_params(distributed.local_copy(params)), observations, group_size,
                            rng, advance, max_turns, first_row)

    def greedy_episodes(self, params: Any, observations: Sequence[dict], advance: Advance,
                        max_turns: int) -> EpisodeBatch:
        """One greedy multi-turn episode per observation (validation, the rollout stage)."""
        return run_episodes(self._greedy_engine, sampling_params(distributed.local_copy(params)), observations, 1,
                            jax.random.key(0), advance, max_turns)

    def prepare_ahead(self, observations: Sequence[dict]) -> None:
        """Process these observations now (a data thread), for the sampler and the learner to find ready."""
        self.engine.prepare_ahead(observations)

    @cached_property
    def _greedy_engine(self) -> RolloutEngine:
        return RolloutEngine(self.cfg, self.processor, replace(self.settings, greedy=True), self.buckets)

    def greedy(self, params: Any, observations: Sequence[dict]) -> Samples:
        """One greedy completion per observation (validation: the answer the rollout stage scores)."""
        batch = self._greedy_engine.generate(sampling_params(distributed.local_copy(params)), observations, 1,
                                             jax.random.key(0))
        return Samples(tokens=batch.completion_ids, mask=batch.completion_mask, logprobs=batch.logprobs,
                       texts=list(batch.texts))

    def build_batch(self, observations: Sequence[dict], completion_tokens: np.ndarray,
                    completion_mask: np.ndarray) -> dict:
        """Prompts processed exactly as the engine does (left-padded, length-bucketed) plus the completions.

        `observations`: one per completion row, or one per group of consecutive rows (rows / observations each).
        In a multi-process run the lists are the global batch's, each observation None where another process holds
        it: every process encodes its own prompts and the encoded prompts are gathered (`global_inputs`).
        """
        rows = len(completion_tokens)
        if not observations or rows % len(observations):
            raise ValueError(f"{rows} completions are not whole groups of {len(observations)} observations")
        if not self.share_prefix:
            observations = [obs for obs in observations for _ in range(rows // len(observations))]
        if distributed.count() > 1:
            inputs = self.global_inputs(observations)
        else:
            inputs = self.engine.prepare(observations)
        if len(np.asarray(inputs.get("image_grid_thw", np.zeros((0, 3))))):
            inputs = self._with_patch_layout(inputs)
        batch = {"inputs": {key: inputs[key] for key in LEARNER_KEYS if key in inputs},
                 "completion_ids": np.asarray(completion_tokens, np.int32),
                 "completion_mask": np.asarray(completion_mask, np.float32)}
        return batch if self.mesh is None else self._place(batch)

    def global_inputs(self, observations: Sequence[dict | None]) -> dict:
        """The processor inputs `engine.prepare` would give for the whole list, from each process encoding the
        observations it holds (the others None): a process's own must be one contiguous run of the list, in
        process order. Prompts are left-padded, so padding a process's rows further on the left to the longest
        process's bucket gives the rows the whole batch would have had."""
        positions = [i for i, obs in enumerate(observations) if obs is not None]
        own = self.engine.prepare([observations[i] for i in positions]) if positions else None
        patch_width = 0 if own is None or "pixel_values" not in own else int(np.asarray(own["pixel_values"]).shape[1])
        headers = distributed.gather_json({"positions": positions, "patch_width": patch_width,
                                           "length": 0 if own is None else int(own["input_ids"].shape[1])})
        order = [i for header in headers for i in header["positions"]]
        if order != list(range(len(observations))):
            raise ValueError(f"the processes' observations are not contiguous shares of the batch in process order "
                             f"(positions {order})")
        length = max(header["length"] for header in headers)
        width = max(header["patch_width"] for header in headers)
        if own is None:
            own = {"input_ids": np.zeros((0, length)), "attention_mask": np.zeros((0, length)),
                   "position_ids": np.zeros((3, 0, length)), "pixel_values": np.zeros((0, width)),
                   "image_grid_thw": np.zeros((0, 3))}
        pad = length - own["input_ids"].shape[1]
        ids = np.pad(np.asarray(own["input_ids"], np.int32), ((0, 0), (pad, 0)), constant_values=self.settings.pad_id)
        attention = np.pad(np.asarray(own["attention_mask"], np.int32), ((0, 0), (pad, 0)))
        position = np.pad(np.asarray(own["position_ids"], np.int32), ((0, 0), (0, 0), (pad, 0)))  # padding sits at 0
        out = {"input_ids": distributed.gather_rows(ids), "attention_mask": distributed.gather_rows(attention),
               "position_ids": distributed.gather_rows(position.transpose(1, 0, 2)).transpose(1, 0, 2)}
        if width:
            out["pixel_values"] = distributed.gather_rows(np.asarray(own["pixel_values"], np.float32))
            out["image_grid_thw"] = distributed.gather_rows(np.asarray(own["image_grid_thw"], np.int32))
        return out

    def encode_targets(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Answer texts as the tokens the model should generate: the text, then <|im_end|>; padded."""
        steps = self.max_new_tokens
        tokens = np.full((len(texts), steps), self.settings.pad_id, np.int32)
        mask = np.zeros((len(texts), steps), np.float32)
        for row, text in enumerate(texts):
            ids = list(self.processor.tokenizer.encode(text, add_special_tokens=False)) + [self.end_of_turn]
            if len(ids) > steps:
                raise ValueError(f"SFT target {row} ({text!r}) is {len(ids)} tokens with {END_OF_TURN}, more than "
                                 f"max_new_tokens={steps}; raise max_new_tokens")
            tokens[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1.0
        return tokens, mask
