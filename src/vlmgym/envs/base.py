"""The environment API: single-step episodes over samples from the webdataset shards.

`reset(idx) -> (state, obs)` shows the images and the question; the truth stays in `state`.
`step(state, action_tokens) -> (state, [], reward, done, info)` decodes the answer and scores it; `info` carries
every named reward component. `step` does not mutate `state`, so GRPO scores a group of answers against one reset.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol


class SampleLike(Protocol):
    """What an env needs of a sample: `vlmgym.data.shards.Sample` or anything with the same three fields."""

    key: str
    images: list  # PIL images, in the order the prompt refers to them
    meta: dict


@dataclass(frozen=True)
class State:
    """One episode: which sample, its labels, env-specific prepared truth, and whether it was answered."""

    idx: int
    key: str
    meta: dict
    truth: Any = None
    done: bool = False
    answer: str | None = None
    extra: dict = field(default_factory=dict)


class Env(abc.ABC):
    """Base class: subclasses set `name` and implement `prompt` and `score` (and usually `corpus`)."""

    name: str = "env"

    def __init__(self, samples: Sequence[SampleLike] | None = None, *, shards_dir: str = "data/shards",
                 split: str = "train", limit: int | None = None, tokenizer: Any = None):
        """Serve `samples`, or read `split` from the webdataset shards in `shards_dir` when none are given."""
        if samples is None:
            from vlmgym.data.shards import read_split

            samples = read_split(shards_dir, split, limit)
            where = f"{shards_dir}/{split}"
        else:
            samples = list(samples)[:limit] if limit is not None else list(samples)
            where = "the given samples"
        if not samples:
            raise ValueError(f"{self.name}: no samples in {where}")
        self.samples = samples
        self.tokenizer = tokenizer
        self.progress = 0.0

    def __len__(self) -> int:
        return len(self.samples)

    def set_progress(self, progress: float) -> None:
        """Training progress in [0, 1] (step / total steps), for rewards with a curriculum."""
        progress = float(progress)
        self.progress = min(1.0, max(0.0, progress)) if math.isfinite(progress) else 0.0

    def reset(self, idx: int) -> tuple[State, dict]:
        """Start an episode on sample `idx` (wrapping around): the state and the observation."""
        sample = self.samples[int(idx) % len(self.samples)]
        state = State(idx=int(idx), key=sample.key, meta=dict(sample.meta), truth=self.prepare_truth(sample))
        return state, self.observation(sample)

    def observation(self, sample: SampleLike) -> dict:
        """Images plus one HF-style user message: an image part per image, then the prompt text."""
        content = [{"type": "image"} for _ in sample.images]
        content.append({"type": "text", "text": self.prompt(sample)})
        return {"images": list(sample.images), "messages": [{"role": "user", "content": content}]}

    def step(self, state: State, action_tokens) -> tuple[State, list, float, bool, dict]:
        """Decode the answer tokens with the env's tokenizer and score them."""
        if isinstance(action_tokens, str):
            return self.step_text(state, action_tokens)
        if self.tokenizer is None:
            raise ValueError(f"{self.name}: step() got token ids but the env has no tokenizer; "
                             "pass tokenizer= to make() or call step_text()")
        # plain ints: fast tokenizers reject numpy integer ids
        text = self.tokenizer.decode([int(t) for t in action_tokens], skip_special_tokens=True)
        return self.step_text(state, text)

    def step_text(self, state: State, text: str) -> tuple[State, list, float, bool, dict]:
        """Score a text answer: (state marked done, no further observation, reward, done=True, info)."""
        reward, info = self.score(state, text)
        return replace(state, done=True, answer=text), [], float(reward), True, info

    # --- what a subclass provides -------------------------------------------

    @abc.abstractmethod
    def prompt(self, sample: SampleLike) -> str:
        """The question shown with the sample's images."""

    @abc.abstractmethod
    def score(self, state: State, text: str) -> tuple[float, dict]:
        """(reward, info with the named reward components) of answer `text` in episode `state`."""

    def prepare_truth(self, sample: SampleLike) -> Any:
        """Anything worth computing once per reset rather than once per answer (default: nothing)."""
        return None

    @classmethod
    def corpus(cls) -> list[str]:
        """Texts the tokenizer should cover for this env: prompts, answer templates, names (default: none)."""
        return []
