"""A toy env and a tiny MLP policy implementing the trainer's Policy interface (test helper, not library code).

The env shows a prompt id and rewards answers that spell that prompt's target sequence and then stop;
the policy is a small autoregressive MLP over a handful of tokens. Training it exercises every part of
the GRPO and SFT loops (sampling, EOS masking, rewards with components, updates, checkpoints) in a
fraction of a second per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vlmgym.envs.base import Env, State
from vlmgym.rl.grpo import mask_after_eos
from vlmgym.rl.loop import Samples

EOS = 0


@dataclass(frozen=True)
class ToySample:
    """A prompt id dressed as a shard sample (no images)."""

    key: str
    images: list
    meta: dict


class ToyTokenizer:
    """Token ids <-> space-separated digits; EOS is special."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The ids as text, dropping EOS when asked."""
        return " ".join(str(int(i)) for i in ids if not (skip_special_tokens and int(i) == EOS))


class ToyEnv(Env):
    """Prompt p's target: `answer_length` tokens from 1..vocab_size-1 depending on p, then EOS."""

    name = "toy"

    def __init__(self, num_prompts: int = 8, vocab_size: int = 6, answer_length: int = 3):
        samples = [ToySample(key=str(p), images=[], meta={"prompt": p}) for p in range(num_prompts)]
        super().__init__(samples, tokenizer=ToyTokenizer())
        self.vocab_size, self.answer_length = vocab_size, answer_length

    def target(self, prompt: int) -> list[int]:
        """The target tokens of a prompt (without EOS)."""
        return [1 + (prompt * 2 + j) % (self.vocab_size - 1) for j in range(self.answer_length)]

    def observation(self, sample: ToySample) -> dict:
        """The base observation plus the prompt id the toy policy reads."""
        return {**super().observation(sample), "prompt": sample.meta["prompt"]}

    def prompt(self, sample: ToySample) -> str:
        return f"prompt {sample.meta['prompt']}"

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """0.75 x share of target positions right + 0.25 x (answer has the target's length, so it stopped)."""
        answer = [int(t) for t in text.split()]
        target = self.target(state.meta["prompt"])
        match = sum(int(a == b) for a, b in zip(answer, target)) / len(target)
        # The trainer passes tokens through the first EOS and decoding drops it: the target's length means the
        # policy stopped right after the answer (a truncated answer without EOS is longer).
        stops = float(len(answer) == len(target))
        return 0.75 * match + 0.25 * stops, {"reward_components": {"match": match, "stops": stops}}

    def ideal_answer(self, meta: dict) -> str:
        """The SFT target of a sample: its target tokens as text."""
        return " ".join(str(t) for t in self.target(meta["prompt"]))

@dataclass(frozen=True)
class ToyPolicy:
    """A 2-layer MLP over (prompt, previous token, position) -> next-token logits; hashable (a jit static arg)."""

    num_prompts: int = 8
    vocab_size: int = 6
    max_new_tokens: int = 4
    hidden: int = 32
    eos_ids: tuple[int, ...] = (EOS,)

    @partial(jax.jit, static_argnames=("self", "dtype"))
    def init(self, key: jax.Array, dtype: Any = jnp.float32) -> dict:
        """Random parameters; `visual` plays the part of a vision tower (it transforms the prompt features)."""
        keys = jax.random.split(key, 6)
        h = self.hidden
        params = {
            "visual": {"w": jax.random.normal(keys[0], (h, h)) / np.sqrt(h), "b": jnp.zeros((h,))},
            "prompt_embed": jax.random.normal(keys[1], (self.num_prompts, h)),
            "token_embed": jax.random.normal(keys[2], (self.vocab_size + 1, h)),  # the last row is BOS
            "position_embed": jax.random.normal(keys[3], (self.max_new_tokens, h)),
            "hidden": {"w": jax.random.normal(keys[4], (h, h)) / np.sqrt(h), "b": jnp.zeros((h,))},
            "out": {"w": jax.random.normal(keys[5], (h, self.vocab_size)) / np.sqrt(h),
                    "b": jnp.zeros((self.vocab_size,))},
        }
        return jax.tree.map(lambda x: x.astype(dtype), params)

    def _hidden(self, params: dict, prompts: jax.Array, previous: jax.Array, positions: jax.Array) -> jax.Array:
        p = jax.tree.map(lambda x: x.astype(jnp.float32), params)
        features = jnp.tanh(p["prompt_embed"][prompts] @ p["visual"]["w"] + p["visual"]["b"])
        x = jnp.tanh(features + p["token_embed"][previous] + p["position_embed"][positions])
        return jnp.tanh(x @ p["hidden"]["w"] + p["hidden"]["b"])

    def _logits(self, params: dict, prompts: jax.Array, previous: jax.Array, positions: jax.Array) -> jax.Array:
        out = jax.tree.map(lambda x: x.astype(jnp.float32), params["out"])
        return self._hidden(params, prompts, previous, positions) @ out["w"] + out["b"]

    @property
    def feature_size(self) -> int:
        """Width of the features a value head reads."""
        return self.hidden

    def logprobs(self, params: dict, batch: dict) -> jax.Array:
        """Teacher-forced log-probs [batch, max_new_tokens] of the batch's tokens; 0 where masked."""
        return self.logprobs_and_features(params, batch)[0]

    def logprobs_and_features(self, params: dict, batch: dict) -> tuple[jax.Array, jax.Array]:
        """`logprobs` and the hidden state that predicts each token [batch, max_new_tokens, hidden]."""
        tokens = batch["tokens"].astype(jnp.int32)
        bos = jnp.full((tokens.shape[0], 1), self.vocab_size, jnp.int32)
        previous = jnp.concatenate([bos, tokens[:, :-1]], axis=1)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        hidden = self._hidden(params, batch["prompt"][:, None], previous, positions)
        out = jax.tree.map(lambda x: x.astype(jnp.float32), params["out"])
        logits = hidden @ out["w"] + out["b"]
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[..., None], axis=-1)[..., 0]
        return jnp.where(batch["mask"] > 0, picked, 0.0), hidden

    def logprobs_and_entropies(self, params: dict, batch: dict) -> tuple[jax.Array, jax.Array]:
        """`logprobs` and each position's entropy of the next-token softmax (0 where masked)."""
        tokens = batch["tokens"].astype(jnp.int32)
        bos = jnp.full((tokens.shape[0], 1), self.vocab_size, jnp.int32)
        previous = jnp.concatenate([bos, tokens[:, :-1]], axis=1)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        log_p = jax.nn.log_softmax(self._logits(params, batch["prompt"][:, None], previous, positions), axis=-1)
        entropy = -(jnp.exp(log_p) * log_p).sum(axis=-1)
        return self.logprobs(params, batch), jnp.where(batch["mask"] > 0, entropy, 0.0)

    def sample(self, params: dict, observations: list[dict], group_size: int, rng: jax.Array) -> Samples:
        """group_size completions per observation, sampled at temperature 1."""
        prompts = np.repeat([obs["prompt"] for obs in observations], group_size).astype(np.int32)
        tokens, logprobs, mask = (np.asarray(x) for x in _toy_sample(params, jnp.asarray(prompts), rng, policy=self))
        texts = [" ".join(str(int(t)) for t, m in zip(row, row_mask) if m > 0) for row, row_mask in zip(tokens, mask)]
        return Samples(tokens=tokens, mask=mask, logprobs=np.where(mask > 0, logprobs, 0.0).astype(np.float32),
                       texts=texts)

    def greedy(self, params: dict, observations: list[dict]) -> Samples:
        """One argmax completion per observation."""
        prompts = np.asarray([obs["prompt"] for obs in observations], np.int32)
        tokens, _, mask = (np.asarray(x) for x in _toy_sample(params, jnp.asarray(prompts), jax.random.key(0),
                                                              policy=self, greedy=True))
        texts = [" ".join(str(int(t)) for t, m in zip(row, row_mask) if m > 0) for row, row_mask in zip(tokens, mask)]
        return Samples(tokens=tokens, mask=mask, logprobs=np.zeros(tokens.shape, np.float32), texts=texts)

    def build_batch(self, observations: list[dict], completion_tokens: np.ndarray, completion_mask: np.ndarray) -> dict:
        """Learner inputs: prompt ids (repeated over each observation's rows), tokens and mask, batch-first."""
        per_observation = len(completion_tokens) // len(observations)
        return {"prompt": np.repeat([obs["prompt"] for obs in observations], per_observation).astype(np.int32),
                "tokens": np.asarray(completion_tokens, np.int32), "mask": np.asarray(completion_mask, np.float32)}

    def encode_targets(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Space-separated token ids + EOS, padded to max_new_tokens."""
        tokens = np.full((len(texts), self.max_new_tokens), EOS, np.int32)
        mask = np.zeros((len(texts), self.max_new_tokens), np.float32)
        for i, text in enumerate(texts):
            ids = [int(t) for t in text.split()] + [EOS]
            if len(ids) > self.max_new_tokens:
                raise ValueError(f"toy target {text!r} is longer than max_new_tokens={self.max_new_tokens}")
            tokens[i, : len(ids)] = ids
            mask[i, : len(ids)] = 1.0
        return tokens, mask


@partial(jax.jit, static_argnames=("policy", "greedy"))
def _toy_sample(params: dict, prompts: jax.Array, rng: jax.Array, policy: ToyPolicy,
                greedy: bool = False) -> tuple[jax.Array, ...]:
    def body(previous, inputs):
        position, key = inputs
        logits = policy._logits(params, prompts, previous, jnp.full(prompts.shape, position))
        token = (jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)).astype(jnp.int32)
        logprob = jnp.take_along_axis(jax.nn.log_softmax(logits), token[:, None], axis=-1)[:, 0]
        return token, (token, logprob)

    start = jnp.full(prompts.shape, policy.vocab_size, jnp.int32)
    keys = jax.random.split(rng, policy.max_new_tokens)
    _, (tokens, logprobs) = jax.lax.scan(body, start, (jnp.arange(policy.max_new_tokens), keys))
    return tokens.T, logprobs.T, mask_after_eos(tokens.T, policy.eos_ids)
