"""The environment API and plug-in interface: one Env subclass is one task, and owns everything the pipeline
needs of it.

Episodes are single-step (several turns with the visual tools option, vlmgym.envs.multiturn), over samples from
the webdataset shards:
`reset(idx) -> (state, obs)` shows the images and the question; the truth stays in `state`.
`step(state, action_tokens) -> (state, [], reward, done, info)` decodes the answer and scores it; `info` carries
every named reward component. `step` does not mutate `state`, so GRPO scores a group of answers against one reset.

The core every task writes (class attributes and classmethods where a stage never loads samples, so it needs no
instance):
- `name`, and `schema` (vlmgym.data.rows.RowSchema: the CSV columns, the images of a row, row validation) for the
  shard stage;
- `prompt(sample)` and `score(state, text)` for train and rollout, `ideal_answer(meta)` (the SFT target);
- `write_synthetic(data, out_dir)`: the embedded offline generator, writing the raw layout (vlmgym.data.layout).

Everything else is optional, with a default that works:
- settings: `Params` (section `env.<name>`; one with the fields of vlmgym.envs.think.ThinkParams adds the R1
  think/answer option, one with those of vlmgym.envs.multiturn.ToolParams the visual tools option),
  `DataParams` (`data.<name>`, the generator's), `recipe`;
- samples and episodes: `check_sample` (meta checks; the schema's image count is checked for every env),
  `prepare_truth`, `ideal_tool_calls` and `turn_reward` (with tools), `corpus` (the tokenizer's texts),
  `perception_heads` / `perception_labels`, `perception_token_heads` / `perception_token_labels`,
  `perception_view` and `perception_source` (sft.perception's warm-up of the vision tower);
- data: `download_hub` (a public dataset); `ood_note` / `describe_ood`, what the out-of-distribution test split
  (test_ood) shifts, when the generator writes one;
- evaluate: rollout record fields, task metrics and report sections (vlmgym.envs.evaluation.EvaluationParts).
A stage that needs a part the env lacks stops with MissingPart, saying which.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from vlmgym.envs import multiturn
from vlmgym.envs import think as r1
from vlmgym.envs.evaluation import EvaluationParts
from vlmgym.envs.tools import BUILTIN_TOOLS, Tool

if TYPE_CHECKING:
    from PIL import Image

    from vlmgym.config.sections import DataParams
    from vlmgym.data.rows import RowSchema


# The key of a state's meta and of a scored answer's info that names the sub-env it belongs to, in an env made of
# several (vlmgym.envs.mixture): the trainer and validation log each sub-env's figures under `env/<name>/`.
PART_KEY = "sub_env"


def part_metric(part: str, metric: str) -> str:
    """The name of a figure `metric` (e.g. reward_mean, val/reward_greedy) over one sub-env's answers alone."""
    return f"env/{part}/{metric}"


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


class MissingPart(RuntimeError):
    """A stage needs a part of the interface this env does not provide (e.g. SFT without an ideal answer)."""


class Env(EvaluationParts, abc.ABC):
    """Base class of a task: the core below is what a subclass writes (`prompt` and `score` are abstract; a stage
    that needs one of the others stops with MissingPart without it), then the optional parts with their defaults
    (the evaluate stage's come from EvaluationParts), then what the pipeline calls, the same for every env."""

    # --- the core: what a task writes ------------------------------------------

    name: ClassVar[str] = "env"
    schema: ClassVar[RowSchema | None] = None  # how the raw layout's CSV rows become shard samples

    @abc.abstractmethod
    def prompt(self, sample: SampleLike) -> str:
        """The question shown with the sample's images."""

    @abc.abstractmethod
    def score(self, state: State, text: str) -> tuple[float, dict]:
        """(reward, info with the named reward components) of answer `text` in episode `state`.

        Never raises on a model's answer: garbage scores 0 with `format_ok` False in `info`."""

    def ideal_answer(self, meta: dict) -> str:
        """The perfect answer for a sample's meta: the SFT target (default: none, so SFT cannot run)."""
        raise MissingPart(f"env {self.name!r} has no ideal_answer, so it cannot be the SFT target; "
                          "set sft.steps: 0 or implement ideal_answer(meta)")

    @classmethod
    def write_synthetic(cls, data: DataParams, out_dir: Path) -> dict:
        """Write the embedded offline dataset in the raw layout (CSV + image zips per split); returns details."""
        raise MissingPart(f"env {cls.name!r} has no embedded generator (data.source: synthetic)")

    # --- optional: settings ----------------------------------------------------

    Params: ClassVar[type | None] = None  # dataclass of the section env.<name> (None: the env takes no settings)
    DataParams: ClassVar[type | None] = None  # dataclass of data.<name>: the generator's settings
    # The settings of the other sections this task trains with, as a partial params mapping (e.g. {"sft":
    # {"optimizer": {"lr": 0.001}}}); `vlmgym recipe <env>` applies it (vlmgym.cli.recipes). Empty: the defaults,
    # the default env's recipe.
    recipe: ClassVar[Mapping[str, Any]] = {}
    # For `vlmgym plan --params` where no params key says it: the typical raw (height, width) of the env's hub images,
    # and the Qwen3-VL text tokens of its first-turn prompt besides the image pads (a recorded count for when no
    # Qwen3-VL tokenizer is at hand). None: the planner asks for --image / --seq.
    hub_image_size: ClassVar[tuple[int, int] | None] = None
    qwen_prompt_text_tokens: ClassVar[int | None] = None

    # --- optional: samples and episodes ----------------------------------------

    def check_sample(self, sample: SampleLike) -> None:
        """Raise a ValueError naming `sample` when this env cannot serve its meta; every sample is checked once,
        when the env is built, after the image count its schema declares. Default: every sample is served."""
        return None

    def prepare_truth(self, sample: SampleLike) -> Any:
        """Anything worth computing once per reset rather than once per answer (default: nothing)."""
        return None

    def turn_reward(self, call: dict) -> float:
        """With tools: the shaping reward of one tool call (a dict with its tool, `ok`, `error` and zoom `box`),
        added to the episode's final reward (vlmgym.envs.multiturn). Default: 0, the answer alone counts."""
        return 0.0

    # The tools `env.<name>.tools` may name (vlmgym.envs.tools: zoom and rotate); an env adds its own here.
    tool_classes: ClassVar[Mapping[str, type[Tool]]] = BUILTIN_TOOLS

    def ideal_tool_calls(self, meta: dict) -> list[dict]:
        """With tools (vlmgym.envs.multiturn): the calls, as {"name": ..., "arguments": {...}}, an ideal episode
        makes before its answer; SFT teaches them turn by turn. Default: none, so SFT teaches answering at once."""
        return []

    @classmethod
    def corpus(cls) -> list[str]:
        """Texts the tokenizer should cover for this env: prompts, answer templates, names (default: none)."""
        return []

    # Class counts of the labels perception_labels gives each image (e.g. ten heads of 0-4 for how many of each
    # digit an image holds): sft.perception trains the vision tower to predict them before SFT. Empty: none.
    perception_heads: ClassVar[tuple[int, ...]] = ()

    def perception_labels(self, meta: dict) -> list[int]:
        """One class per head of `perception_heads` for the sample's image (default: none, so the warm-up cannot
        run)."""
        raise MissingPart(f"env {self.name!r} has no perception labels, so sft.perception cannot warm its vision "
                          "tower up; set sft.perception.steps: 0 or implement perception_heads and "
                          "perception_labels(meta)")

    # Class counts of the labels perception_token_labels gives each merged image token (e.g. the coded and the plain
    # letter of the table cell under it): sft.perception trains every token to carry what its own part of the image
    # shows, through one head the tokens share. Empty: none.
    perception_token_heads: ClassVar[tuple[int, ...]] = ()

    def perception_token_labels(self, meta: dict, rows: int, cols: int) -> list[list[int]]:
        """One class per head of `perception_token_heads` for each of the image's rows x cols merged tokens, in row
        order; the token grid spans the whole image (default: none)."""
        raise MissingPart(f"env {self.name!r} has no perception token labels; implement perception_token_heads and "
                          "perception_token_labels(meta, rows, cols)")

    @classmethod
    def has_perception_labels(cls) -> bool:
        """Whether the env labels its images (or their tokens) for sft.perception."""
        return bool(cls.perception_heads or cls.perception_token_heads)

    def perception_source(self) -> Env | None:
        """The env whose samples and labels sft.perception learns from: this one when it has labels (default), else
        None. An env made of others (mixture) answers with the one of them that has labels."""
        return self if self.has_perception_labels() else None

    def perception_view(self, image: Image.Image, meta: dict) -> tuple[Image.Image, dict]:
        """The image and meta the warm-up learns a sample from (default: the sample's own). An env whose task images
        show too little for the tower to learn to read (message_decoding's word tables) shows it more here; the
        labels are then taken from the returned meta."""
        return image, meta

    # --- optional: data --------------------------------------------------------

    @classmethod
    def download_hub(cls, data: DataParams, out_dir: Path) -> dict:
        """Download the env's public dataset into the raw layout; returns details."""
        raise MissingPart(f"env {cls.name!r} has no public dataset loader (data.source: hub); "
                          "use data.source: synthetic")

    # What the out-of-distribution split test_ood shifts, for report headings ("" : the env's generator writes
    # none). A generator that defines one writes test_ood beside train and test when data.ood_images > 0: test's
    # task under a shift that train never shows, so a policy's ID-to-OOD drop measures how far what it learned
    # carries over. The rollout stage answers it too and the evaluate stage reports it beside test.
    ood_note: ClassVar[str] = ""

    @classmethod
    def describe_ood(cls, settings: Any) -> str:
        """The configured shift, for an env whose generator offers several (its DataParams `settings`; default:
        "", the general ood_note stands)."""
        return ""

    # --- what the pipeline calls: episodes, data, report headings ---------------

    def __init__(self, samples: Sequence[SampleLike] | None = None, *, shards_dir: str = "data/shards",
                 split: str = "train", limit: int | None = None, tokenizer: Any = None, params: Any = None):
        """Serve `samples`, or read `split` from the webdataset shards in `shards_dir` when none are given;
        `params` is the env's own section (an instance of `Params`; None: its defaults)."""
        if samples is None:
            from vlmgym.data.shards import open_split

            # Indexed, not decoded: a sample's images are read from its tar when an episode shows them.
            image_exts = self.schema.image_exts if self.schema is not None else None
            samples = open_split(shards_dir, split, limit, image_exts=image_exts)
            where = f"{shards_dir}/{split}"
        else:
            samples = list(samples)[:limit] if limit is not None else list(samples)
            where = "the given samples"
        if not samples:
            raise ValueError(f"{self.name}: no samples in {where}")
        for sample in samples:
            self._check_images(sample)
            self.check_sample(sample)
        self.samples = samples
        self.tokenizer = tokenizer
        self.params = params if params is not None else (self.Params() if self.Params is not None else None)
        self.progress = 0.0
        _ = self.tools  # a bad tools/max_turns setting stops here, before any episode

    def _check_images(self, sample: SampleLike) -> None:
        """The check every env with a schema shares: a sample has the images its prompt shows, no more."""
        if self.schema is None:
            return
        count, least = self.schema.image_count, self.schema.min_images or self.schema.image_count
        if least <= len(sample.images) <= count:
            return
        roles = self.schema.image_roles
        expected = f"{least} to {count}" if least < count else f"{count}"
        raise ValueError(f"{self.name}: sample {sample.key!r} has {len(sample.images)} images, expected "
                         f"{expected}" + (f" ({', '.join(roles)})" if roles else ""))

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
        if self.max_turns > 1:
            return multiturn.begin(state, self.observation(sample), self.tools,
                                   bool(getattr(self.params, "list_tools", True)))
        return state, self.observation(sample)

    def observation(self, sample: SampleLike) -> dict:
        """Images plus one HF-style user message: an image part per image, then the prompt text."""
        content = [{"type": "image"} for _ in sample.images]
        question = self.prompt(sample)
        if self.max_turns > 1:
            question = f"{question} {multiturn.instruction(self.tools, self.max_turns)}"
        content.append({"type": "text", "text": r1.prompt(question) if self.think else question})
        return {"images": list(sample.images), "messages": [{"role": "user", "content": content}]}

    def step(self, state: State, action_tokens) -> tuple[State, Any, float, bool, dict]:
        """Decode the answer tokens with the env's tokenizer and score them (or, in a multi-turn episode, run the
        turn's tool call: vlmgym.envs.multiturn)."""
        if isinstance(action_tokens, str):
            return self.step_text(state, action_tokens)
        if self.tokenizer is None:
            raise ValueError(f"{self.name}: step() got token ids but the env has no tokenizer; "
                             "pass tokenizer= to make() or call step_text()")
        # plain ints: fast tokenizers reject numpy integer ids
        ids = [int(t) for t in action_tokens]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if self.max_turns > 1:
            return multiturn.take_turn(self, state, text, ids)
        return self.step_text(state, text)

    def step_text(self, state: State, text: str) -> tuple[State, Any, float, bool, dict]:
        """`step` of a text turn (in a multi-turn episode, the next turn re-encodes this text)."""
        if self.max_turns > 1:
            return multiturn.take_turn(self, state, text, None)
        return self.score_answer(state, text)

    def score_answer(self, state: State, text: str) -> tuple[State, list, float, bool, dict]:
        """Score a text answer: (state marked done, no further observation, reward, done=True, info); with the
        think option, the env scores the answer block and the structure adds its share (vlmgym.envs.think)."""
        if not self.think:
            reward, info = self.score(state, text)
        else:
            text = text if isinstance(text, str) else ""
            reward, info = self.score(state, r1.answer(text))
            reward, info = r1.combine(reward, info, r1.structure_ok(text), self.params.think_format_weight)
        return replace(state, done=True, answer=text), [], float(reward), True, info

    @functools.cached_property
    def tools(self) -> tuple[Tool, ...]:
        """The visual tools this env's episodes offer (its settings' `tools`, vlmgym.envs.multiturn)."""
        return multiturn.tools_of(self)

    @property
    def max_turns(self) -> int:
        """Policy turns an episode may take: 1 without tools."""
        return int(getattr(self.params, "max_turns", 1)) if self.tools else 1

    @property
    def think(self) -> bool:
        """Whether this env runs with the R1 think/answer convention (its settings' `think`)."""
        return bool(getattr(self.params, "think", False))

    def sft_target(self, meta: dict) -> str:
        """What SFT teaches for a sample: the ideal answer, inside the R1 tags with the think option."""
        ideal = self.ideal_answer(meta)
        return r1.target(ideal) if self.think else ideal

    @classmethod
    def data_settings(cls, data: DataParams) -> Any:
        """This env's section of `data` (data.<name>), or its defaults; None when the env has no DataParams."""
        section = data.sections.get(cls.name)
        if section is None and cls.DataParams is not None:
            section = cls.DataParams()
        return section

    @classmethod
    def build_raw(cls, data: DataParams, out_dir: Path) -> dict:
        """The raw layout for `data.source` (synthetic or hub), written into `out_dir`."""
        writer = cls.write_synthetic if data.source == "synthetic" else cls.download_hub
        return writer(data, Path(out_dir)) or {}

    @classmethod
    def generate(cls, n: int, *, seed: int = 0, split: str = "train", data: DataParams | None = None) -> list:
        """`n` samples of the embedded generator in memory (vlmgym.data.shards.Sample: key, PIL images, meta),
        validated by the env's schema as the shard stage does (without its resizing)."""
        from vlmgym.data.raw_samples import generate_samples  # at call time: it loads webdataset (seconds)

        return generate_samples(cls, n, seed=seed, split=split, data=data)

    @classmethod
    def ood_description(cls, data: DataParams | None = None) -> str:
        """What test_ood shifts when generated with the `data` settings, for report headings: describe_ood of the
        env's generator settings, or ood_note (no settings given, or nothing more specific to say)."""
        if data is None or cls.DataParams is None:
            return cls.ood_note
        return cls.describe_ood(cls.data_settings(data)) or cls.ood_note
