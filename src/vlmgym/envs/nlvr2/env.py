"""nlvr2: two images and a statement about them; the answer is True or False; reward 1 or 0.

Data (data.py): synthetic scene pairs with statements true by construction (the default), or NLVR2 from the hub,
both in the nlvr2 raw layout (CSV id, sentence, label, left, right[, trace] + image zips). With a trace (the
synthetic generator's, on by default: env.nlvr2.trace) the answer says what each image holds before the verdict.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.config.spec import spec
from vlmgym.data.rows import Row, RowSchema, RowSkip
from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.nlvr2 import data as nlvr2_data
from vlmgym.envs.nlvr2 import types as nlvr2_types
from vlmgym.envs.think import ThinkParams
from vlmgym.stats.bootstrap import Statistic
from vlmgym.stats.fields import record_field, record_where

ANSWER_VALUES = {"true": True, "yes": True, "false": False, "no": False}
FORMAT_PATTERN = re.compile(r"\s*(true|false)\s*\.?\s*", re.IGNORECASE)
TRACE = re.compile(r"\s*left:[a-z\s,]+\.\s*right:[a-z\s,]+\.(?:\s*[a-z\s]+:\s*left (?:yes|no),\s*right (?:yes|no)\.)?",
                   re.IGNORECASE)
TRACE_FORMAT_PATTERN = re.compile(TRACE.pattern + FORMAT_PATTERN.pattern, re.IGNORECASE)

PROMPT = ("The first image is the left image and the second image is the right image.\n"
          "Statement: {sentence}\n"
          "Is the statement true or false? Answer with one word: True or False.")
# With a trace: the same question, asking for the description first. Both fit the 128-token prompt bucket with the
# default tiny tokenizer (tests/envs/test_prompt_buckets.py), which is trained on PROMPT alone (the geospot default's
# tokenizer includes nlvr2's corpus, so a new corpus text would move the default pipeline).
TRACE_PROMPT = PROMPT.replace("Answer with one word: True or False.",
                              "Say what each image holds, then answer True or False.")


# The verdict: one answer word, alone or in a plain statement of it, optionally after a yes / no that agrees
# ("True", "Yes, the statement is true.", "The answer: **False**", "No, it is false!"). Anything else -- a negation
# ("not true"), both words ("true or false"), a hedge ("probably true", "I think true"), more words, tags, a trace's
# "left yes" -- is no verdict: reading the answer word out of it would pay for what the answer does not say.
_WORD = r"(true|false|yes|no)"
_LEAD = r"(?:(?:the\s+)?(?:answer|verdict|statement)(?:\s+is\s*:?|\s*:)|(?:it|this|that)(?:\s+is|'s))"
VERDICT = re.compile(rf"(?:{_WORD}\s*[,.!:]?\s+)?(?:{_LEAD}\s*)?{_WORD}\s*[.!]?", re.IGNORECASE)
MAX_VERDICT_CHARS = 80  # the longest verdict is under 40 characters; longer text is not read (bounds regex work)
_DECORATION = str.maketrans({c: "" for c in "*_`\"()[]"})  # markdown emphasis, quotes, brackets: no words
_APOSTROPHE = str.maketrans({"’": "'", "ʼ": "'"})


def parse_answer(text: str) -> bool | None:
    """True / False when `text` is a verdict (VERDICT: one answer word, maybe in a plain sentence stating it);
    None for anything else, and when a leading yes / no disagrees with the word."""
    text = text if isinstance(text, str) else ""
    if len(text) > MAX_VERDICT_CHARS:
        return None
    match = VERDICT.fullmatch(" ".join(text.translate(_DECORATION).translate(_APOSTROPHE).split()))
    if match is None:
        return None
    values = {ANSWER_VALUES[word.lower()] for word in match.groups() if word}
    return values.pop() if len(values) == 1 else None


def answer_word(value: bool) -> str:
    """The canonical answer for a truth value."""
    return "True" if value else "False"


@dataclass(frozen=True)
class NLVR2Params(ThinkParams):
    """nlvr2's answer: the verdict, after a description of both images where the data has one."""

    trace: bool = spec(True, doc="where a sample has a trace (the synthetic generator's: 'left: blue, red. right: "
                                 "green.'), the prompt asks to say what each image holds before True or False and "
                                 "SFT teaches that trace; only the verdict is scored. Off (and for the hub's "
                                 "pairs): the one word, which the tiny default model does not learn")


def parse_row(rec: dict[str, str]) -> Row:
    """One raw row (id, sentence, label, left, right[, trace]) as a sample; bad labels and ids are counted
    skips."""
    pair_id = rec["id"].strip()
    key = re.sub(r"[^A-Za-z0-9_-]", "_", pair_id)
    if not pair_id:
        raise RowSkip("bad_id", "empty id")
    sentence = " ".join(rec["sentence"].split())
    if not sentence:
        raise RowSkip("missing_sentence", "empty sentence")
    if rec["label"] not in ("True", "False"):
        raise RowSkip("bad_label", f"label {rec['label']!r} is not True/False")
    meta = {"id": pair_id, "sentence": sentence, "label": rec["label"] == "True"}
    trace = " ".join((rec.get("trace") or "").split())
    if trace:  # only the synthetic generator writes one
        meta["trace"] = trace
    return Row(key, (rec["left"], rec["right"]), meta)


class NLVR2Env(Env):
    """Decide whether a statement about a left and a right image is true; samples come from webdataset shards."""

    name = "nlvr2"
    Params = NLVR2Params
    DataParams = nlvr2_data.NLVR2DataParams
    schema = RowSchema("nlvr2", ("id", "sentence", "label", "left", "right"), ("left.jpg", "right.jpg"), parse_row)
    solved_metric = "accuracy"
    # the overall accuracy, then one per statement type (synthetic templates; the real NLVR2 has only the first)
    metric_rows = {"accuracy": ("accuracy", "rate"), **nlvr2_types.metric_rows(),
                   "trace_exact": ("trace exact: description and lookup (samples with a trace)", "rate")}
    ood_note = "the statements over shapes of another size (data.nlvr2.ood_object_scale), which train never shows"
    # At geospot's SFT lr 3e-3 the trace collapses to one answer (docs/envs/nlvr2.md: 50.0%); at 1e-3 SFT reaches 92.9%
    # in 600 steps, too sure for GRPO's groups to differ. 350 steps leave it at 73.8% on val, and GRPO gains from there
    # only with small steps near the greedy answer: lr 3e-5 at temperature 0.6 (val +0.039 by step 125), where lr 1e-4
    # broke the trace's format and 3e-5 at temperature 1 stayed flat.
    recipe = {"sft": {"optimizer": {"lr": 0.001}, "steps": 350},
              "train": {"optimizer": {"lr": 3e-5}, "sampling": {"temperature": 0.6}}}

    def check_sample(self, sample: SampleLike) -> None:
        sentence, label = sample.meta.get("sentence"), sample.meta.get("label")
        if not isinstance(sentence, str) or not sentence.strip():
            raise ValueError(f"nlvr2: sample {sample.key} has no sentence (meta {sample.meta!r})")
        if not isinstance(label, bool):
            raise ValueError(f"nlvr2: sample {sample.key} has label {label!r}, expected true or false")

    @classmethod
    def describe_ood(cls, s: Any) -> str:
        """The configured size shift (data.nlvr2.ood_object_scale against object_scale)."""
        return (f"the statements over shapes scaled {s.ood_object_scale:g}x (train and test: {s.object_scale:g}x; "
                "data.nlvr2.ood_object_scale), a size train never shows")

    def uses_trace(self, meta: Mapping[str, Any]) -> bool:
        """Whether this sample's answer starts with the trace: the trace option is on and the sample has one."""
        return bool(getattr(self.params, "trace", False)) and bool(meta.get("trace"))

    def prompt(self, sample: SampleLike) -> str:
        """The statement and the question: the one word, or (with a trace) the description, then the word."""
        return (TRACE_PROMPT if self.uses_trace(sample.meta) else PROMPT).format(sentence=sample.meta["sentence"])

    def prepare_truth(self, sample: SampleLike) -> bool:
        """The sample's truth value."""
        return sample.meta["label"]

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """1 when the answer is a verdict (parse_answer) naming the right truth value, alone or after a trace, else
        0; the trace is not read for it (its lookup says yes and no)."""
        text = text if isinstance(text, str) else ""
        trace, asked = TRACE.match(text), self.uses_trace(state.meta)
        answer = parse_answer(text[trace.end():] if trace else text)
        correct = answer is not None and answer == state.truth
        reward = 1.0 if correct else 0.0
        info = {
            "answer": None if answer is None else answer_word(answer),
            "pred_label": answer,
            "label": answer_word(state.truth),
            "correct": correct,
            "format_ok": (TRACE_FORMAT_PATTERN if asked else FORMAT_PATTERN).fullmatch(text) is not None,
            "trace": " ".join(trace.group(0).split()) if trace else None,
            "trace_asked": asked,
            "parse_failed": answer is None,
            "reward_components": {"correct": reward},
        }
        return reward, info

    def ideal_answer(self, meta: dict[str, Any]) -> str:
        """The SFT target for a sample's meta: 'True' or 'False', after the trace when the sample uses one."""
        verdict = answer_word(meta["label"])
        return f"{meta['trace']} {verdict}" if self.uses_trace(meta) else verdict

    @classmethod
    def corpus(cls) -> list[str]:
        """Prompt, answer words and example statements covering the synthetic vocabulary (tokenizer training)."""
        vocabulary = " ".join([*nlvr2_data.NUMBER_WORDS, *nlvr2_data.COLOURS, *nlvr2_data.SIZES, *nlvr2_data.SIDES,
                               *nlvr2_data.RELATIONS, *nlvr2_data.SHAPES, *(s + "s" for s in nlvr2_data.SHAPES)])
        return [PROMPT.format(sentence=""), "True", "False", "true", "false", "yes", "no", "Yes", "No", vocabulary,
                *nlvr2_data.statement_corpus()]

    @classmethod
    def write_synthetic(cls, data: Any, out_dir: Path) -> dict:
        """Synthetic scene pairs; `data.train_images` / `data.test_images` count pairs (statements)."""
        return nlvr2_data.write_synthetic_raw(data, out_dir, cls.data_settings(data))

    @classmethod
    def download_hub(cls, data: Any, out_dir: Path) -> dict:
        """NLVR2 from the hub (its parquet conversion), the first train_images / test_images rows per split."""
        return nlvr2_data.download_hub_raw(data, out_dir)

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        """The answer word and description, the predicted truth value and the truth (label, sentence, trace)."""
        word = info.get("answer")
        truth = {"label": meta.get("label"), "sentence": meta.get("sentence")}
        if info.get("trace_asked"):  # the trace the answer was asked for (none with env.nlvr2.trace off)
            truth["trace"] = meta["trace"]
        return {"parsed": {"answer": word, "trace": info.get("trace")},
                "pred_label": {"True": True, "False": False}.get(word) if isinstance(word, str) else None,
                "truth": truth}

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        """A true/false answer."""
        return isinstance(record.get("pred_label"), bool)

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
        """Accuracy: the answer names the truth value (no answer is wrong, never a side); overall and per
        statement type (types.py)."""
        correct = []
        for i, record in enumerate(records):
            where = record_where(record, i)
            truth = record_field(record, "truth", where)
            label = truth.get("label") if isinstance(truth, Mapping) else None
            if not isinstance(label, bool):
                raise ValueError(f"{where}: truth.label must be true or false, got {label!r}")
            predicted = record.get("pred_label")
            correct.append(isinstance(predicted, bool) and predicted is label)
        correct = np.asarray(correct, np.float64)
        stats = {"accuracy": Statistic("mean", correct), **nlvr2_types.type_statistics(records, correct)}
        # The description's accuracy, over the samples that have a trace: what the policy sees, apart from what it
        # concludes (perception or binding).
        truths = [(record.get("truth") or {}).get("trace") for record in records]
        if any(truths):
            has = np.array([bool(t) for t in truths], np.float64)
            said = [(record.get("parsed") or {}).get("trace") for record in records]
            exact = np.array([bool(t) and s == t for s, t in zip(said, truths)], np.float64)
            stats["trace_exact"] = Statistic("ratio", exact, has)
        return stats

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        """The statement and its truth value."""
        sentence = truth.get("sentence")
        return f"{sentence} -> {truth.get('label')}" if sentence else f"{truth.get('label')}"

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        """correct or wrong."""
        return "correct" if record.get("pred_label") is record["truth"].get("label") else "wrong"

    @classmethod
    def report_html(cls, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], params: Any) -> str:
        """Per statement type: how many samples, how many are true, and per policy how often it answers True and
        how often it is right (the shown samples; the summary table has every sample, with intervals)."""
        rows = []
        for template, (label, _) in [*nlvr2_types.TEMPLATE_TYPES.items(), (None, ("other (not a template)", None))]:
            cells = []
            for records in records_by_policy.values():
                mine = [r for r in records if nlvr2_types.statement_type(r["truth"].get("sentence")) == template]
                if not cells:
                    if not mine:
                        break
                    true_share = np.mean([r["truth"].get("label") is True for r in mine])
                    cells += [str(len(mine)), f"{100 * true_share:.0f}%"]
                if not mine:  # a policy that answered other samples
                    cells += ["n/a", "n/a"]
                    continue
                said_true = np.mean([r.get("pred_label") is True for r in mine])
                right = np.mean([r.get("pred_label") is r["truth"].get("label") for r in mine])
                cells += [f"{100 * said_true:.0f}%", f"{100 * right:.0f}%"]
            if cells:
                rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in [label, *cells]) + "</tr>")
        heads = "".join(f"<th>{html.escape(p)}: says True</th><th>{html.escape(p)}: right</th>"
                        for p in records_by_policy)
        return ("<h2>Statement types</h2><p>A policy that says True (or False) on ~100% of a type has learned "
                "nothing about it; right ~50% is chance.</p><table><tr><th>type</th><th>samples</th><th>true</th>"
                f"{heads}</tr>{''.join(rows)}</table>")
