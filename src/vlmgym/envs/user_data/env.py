"""user_data: train on your own data without writing an env: a VLM-R1 jsonl, or a `datasets` folder or parquet files
(data.py, read.py), scored by named rewards and your own TRL-style functions (rewards.py, functions.py).

The question is shown after the sample's images (1 to 4); the answer of the data is the SFT target. The reward is
the weighted mean of env.user_data.rewards ({name: weight}), in [0, 1]: each named reward (rewards.py) and each
`module:function` (functions.py) scores the answer in [0, 1]; junk (rewards.is_junk) gets 0 from every one.
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.config.spec import ParamsError, spec
from vlmgym.data.rows import Row, RowSchema, RowSkip
from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.think import ThinkParams
from vlmgym.envs.user_data import data as user_data
from vlmgym.envs.user_data import functions as fns
from vlmgym.envs.user_data import rewards
from vlmgym.envs.user_data.read import MAX_IMAGES
from vlmgym.stats.bootstrap import Statistic

NAME = "user_data"
IMAGE_EXTS = tuple(f"image{i}.jpg" for i in range(1, MAX_IMAGES + 1))
SHOWN_CHARS = 300  # of an answer or a question kept in a rollout record


@dataclass(frozen=True)
class UserDataParams(ThinkParams):
    """user_data's reward: named rewards and your TRL-style functions, with weights."""

    rewards: dict[str, float] = spec(default_factory=lambda: {"accuracy": 1.0},
                                     doc="reward name -> weight; the reward is their weighted mean. Names: accuracy "
                                         "(by the answer's kind), exact, numeric, choice, iou, format, or "
                                         "'module:function' (TRL's f(completions, **columns) -> list[float])")
    completions: str = spec("chat", choices=("chat", "text"),
                            doc="how functions get the answers: chat [[{role: assistant, content}]] (TRL's "
                                "conversational form, VLM-R1's), or text [answer]")
    max_answer_chars: int = spec(2000, ge=1, doc="a longer answer is junk: 0 from every reward")
    numeric_tolerance: float = spec(0.0, ge=0, doc="numeric: an answer this close to the true number is right")
    numeric_relative_tolerance: float = spec(0.0, ge=0, doc="numeric: or this share of the true number")
    iou_threshold: float = spec(0.0, ge=0, le=1, doc="iou: 0 pays the IoU itself; above 0, 1 at or above it, else 0")

    def __post_init__(self) -> None:
        if not self.rewards:
            raise ParamsError("env.user_data.rewards: name at least one reward")
        for name, weight in self.rewards.items():
            if not (fns.is_function_name(name) or name in rewards.NAMED):
                raise ParamsError(f"env.user_data.rewards.{name}: unknown reward (named: {', '.join(rewards.NAMED)}; "
                                  "or 'module:function')")
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not (math.isfinite(weight)
                                                                                      and weight >= 0):
                raise ParamsError(f"env.user_data.rewards.{name}: weight must be a finite number >= 0, got {weight!r}")
        if sum(self.rewards.values()) <= 0:
            raise ParamsError("env.user_data.rewards: the weights sum to 0")

    def settings(self) -> rewards.Settings:
        return rewards.Settings(self.max_answer_chars, self.numeric_tolerance, self.numeric_relative_tolerance,
                                self.iou_threshold)


def parse_row(rec: dict[str, str]) -> Row:
    """One raw row (id, question, answer, images, columns) as a sample."""
    key, question, answer = rec["id"].strip(), rec["question"].strip(), rec["answer"].strip()
    names = tuple(n for n in rec["images"].split(user_data.SEPARATOR) if n)
    if not question or not answer:
        raise RowSkip("missing_answer" if question else "missing_question", f"row {key!r}")
    if not 1 <= len(names) <= MAX_IMAGES:
        raise RowSkip("image_count", f"{len(names)} images, 1 to {MAX_IMAGES}")
    try:
        columns = json.loads(rec["columns"] or "{}")
    except ValueError:
        raise RowSkip("bad_types", "columns is not JSON") from None
    if not isinstance(columns, dict):
        raise RowSkip("bad_types", "columns is not a JSON object")
    return Row(key, names, {"id": key, "question": question, "answer": answer, "columns": columns})


class UserDataEnv(Env):
    """Your own question/answer data with images; see the module docstring."""

    name = NAME
    Params = UserDataParams
    DataParams = user_data.UserDataFiles
    schema = RowSchema(NAME, user_data.CSV_COLUMNS, IMAGE_EXTS, parse_row, min_images=1)
    solved_metric = "accuracy"
    metric_rows = {"accuracy": ("accuracy (exact, numeric, letter; box: IoU >= 0.5)", "rate"),
                   **{f"accuracy_{kind}": (f"accuracy on {kind} answers", "rate") for kind in rewards.KINDS},
                   "mean_iou": ("mean IoU (box answers)", "score")}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = self.params.settings()
        names = [n for n in self.params.rewards if fns.is_function_name(n)]
        self.functions = fns.Functions.of(names, self.params.completions) if names else None
        if self.functions is not None:  # a broken function stops the stage now, not hours into a run
            meta = self.samples[0].meta
            self.functions.check(meta["answer"], meta.get("columns") or {}, meta["question"])

    def check_sample(self, sample: SampleLike) -> None:
        meta = sample.meta
        if not (isinstance(meta.get("question"), str) and isinstance(meta.get("answer"), str) and meta["answer"]):
            raise ValueError(f"{NAME}: sample {sample.key!r} has no question or answer (meta {meta!r})")

    def prompt(self, sample: SampleLike) -> str:
        return sample.meta["question"]

    def prepare_truth(self, sample: SampleLike) -> str:
        return rewards.kind_of(sample.meta["answer"])

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """The weighted mean of the configured rewards (module docstring); never raises."""
        text = text if isinstance(text, str) else ""
        truth = state.meta["answer"]
        junk = rewards.is_junk(text, self.settings.max_answer_chars)
        components: dict[str, float] = {}
        weights: dict[str, float] = {}
        errors: dict[str, str] = {}
        for name, weight in self.params.rewards.items():
            if not fns.is_function_name(name):
                components[name], weights[name] = rewards.score_named(name, text, truth, self.settings), weight
        if self.functions is not None:
            values: dict[str, float] = {}
            if junk:
                values = dict.fromkeys(self.functions.loaded, 0.0)
            else:
                values, errors = self.functions.score(text, state.meta.get("columns") or {}, state.meta["question"])
            for name, value in values.items():
                components[fns.component_name(name)] = value
                weights[fns.component_name(name)] = self.params.rewards[name]
            components[fns.FAILED] = float(bool(errors))
        total = sum(weights.values())
        reward = sum(components[n] * w for n, w in weights.items()) / total
        form = rewards.score_named("format", text, truth, self.settings) > 0
        correct = rewards.correct(text, truth, self.settings)
        info = {"parsed": {"answer": None if junk else rewards.normalise(text)[:SHOWN_CHARS]},
                "kind": state.truth or rewards.kind_of(truth), "correct": correct, "format_ok": form,
                "reward_components": components}
        if info["kind"] == "box":
            info["iou"] = rewards.score_named("iou", text, truth, rewards.Settings(self.settings.max_answer_chars))
        if errors:
            info["reward_errors"] = errors
        return min(1.0, max(0.0, reward)), info

    def ideal_answer(self, meta: dict) -> str:
        return meta["answer"]

    @classmethod
    def corpus(cls) -> list[str]:
        """The demo's questions and answers, digits and letters (your data's own words are not known here)."""
        return [*(q.replace("<image>", "") for q in user_data.DEMO_QUESTIONS.values()), *user_data.DEMO_COLOURS,
                "A", "B", "C", "D", "0 1 2 3 4 5 6 7 8 9", "[100, 200, 300, 400]"]

    # --- data -------------------------------------------------------------------

    @classmethod
    def build_raw(cls, data: Any, out_dir: Path) -> dict:
        """Your files (data.user_data.path, or train and test) whatever data.source says; without them, the
        embedded demo set (data.source: synthetic)."""
        files = cls.data_settings(data)
        if files.given():
            return user_data.write_user_raw(files, data.seed, Path(out_dir))
        return super().build_raw(data, out_dir)

    @classmethod
    def write_synthetic(cls, data: Any, out_dir: Path) -> dict:
        """The demo set: coloured squares, with a text, number, letter and box question in turn."""
        return user_data.write_demo_raw(data, Path(out_dir))

    # --- evaluation --------------------------------------------------------------

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        return {"parsed": info.get("parsed"), "correct": bool(info.get("correct")), "iou": info.get("iou"),
                "truth": {"answer": meta.get("answer"), "kind": info.get("kind"),
                          "question": str(meta.get("question", ""))[:SHOWN_CHARS]},
                **({"reward_errors": info["reward_errors"]} if info.get("reward_errors") else {})}

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        return (record.get("parsed") or {}).get("answer") is not None

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
        """Accuracy overall and per answer kind (the kinds present), and the mean IoU of box answers."""
        correct = np.asarray([bool(r.get("correct")) for r in records], np.float64)
        kinds = [(r.get("truth") or {}).get("kind") for r in records]
        stats = {"accuracy": Statistic("mean", correct)}
        for kind in rewards.KINDS:
            mine = np.asarray([k == kind for k in kinds], np.float64)
            if mine.any():
                stats[f"accuracy_{kind}"] = Statistic("ratio", correct * mine, mine)
        boxes = np.asarray([k == "box" for k in kinds], np.float64)
        if boxes.any():
            ious = np.asarray([float(r.get("iou") or 0.0) for r in records], np.float64)
            stats["mean_iou"] = Statistic("ratio", ious * boxes, boxes)
        return stats

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        return f"{truth.get('question', '')} -> {truth.get('answer')}"

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        return "correct" if record.get("correct") else "wrong"

    @classmethod
    def report_html(cls, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], params: Any) -> str:
        """Per answer kind: samples, and each policy's accuracy on them."""
        kinds = Counter((r.get("truth") or {}).get("kind") for records in records_by_policy.values()
                        for r in records)
        rows = ""
        for kind in rewards.KINDS:
            if not kinds.get(kind):
                continue
            cells = []
            for records in records_by_policy.values():
                mine = [r for r in records if (r.get("truth") or {}).get("kind") == kind]
                cells.append(f"{100 * np.mean([bool(r.get('correct')) for r in mine]):.0f}%" if mine else "n/a")
            rows += f"<tr><td>{kind}</td>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        heads = "".join(f"<th>{html.escape(p)}</th>" for p in records_by_policy)
        return f"<h2>Accuracy by answer kind</h2><table><tr><th>kind</th>{heads}</tr>{rows}</table>"
