"""The evaluate stage's optional part of the Env interface: how a task's rollout records, metrics and report look.

Every member has a default that works, so a task that overrides none still gets rollout records, the shared
metrics (format-valid rate, mean reward) and a report with a gallery; each one it overrides adds its own. Env
inherits these, so a plug-in overrides them on its Env subclass like any other part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from vlmgym.stats.bootstrap import Statistic


class EvaluationParts:
    """Rollout records, task metrics and report sections of an Env (module docstring); all classmethods, so the
    evaluate stage needs no env instance."""

    # metric -> (table label, kind: rate | km | score | reward | count), in table order; kinds pick the format
    metric_rows: ClassVar[dict[str, tuple[str, str]]] = {}
    # The task statistic (task_statistics) that is 1 for a correct answer and 0 otherwise, e.g. an exact-match
    # accuracy: what pass@k counts over sampled answers ("": the reward is graded and there is no such bit).
    solved_metric: ClassVar[str] = ""
    # Reward levels, coarse to fine: label -> (the reward component holding the level's unweighted score, the one
    # holding its weight in the total, or None). The report draws each level's training curve beside the weighted
    # total, because a curriculum that shifts weight to harder levels makes the total fall while every level
    # holds or improves. Empty: the env's reward has no levels and the report shows the total alone.
    reward_levels: ClassVar[dict[str, tuple[str, str | None]]] = {}

    # --- records ---------------------------------------------------------------

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        """The env's fields of a rollout record (after id, policy, env, answer): what the answer parsed to and
        the truth (default: info["parsed"] and the whole meta)."""
        return {"parsed": info.get("parsed"), "truth": dict(meta)}

    @classmethod
    def finish_record(cls, record: dict[str, Any]) -> dict[str, Any]:
        """Fields derived from a complete, JSON-safe record, appended last (default: none)."""
        return record

    # --- metrics ---------------------------------------------------------------

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
        """Per-sample arrays of the env's own metrics (vlmgym.stats.bootstrap.Statistic), before the shared
        format-valid rate and mean reward; `options` are the env's (e.g. a test's reverse geocoder)."""
        return {}

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        """Whether the record holds a prediction the metrics can use (with format_ok: the format-valid rate)."""
        return True

    @classmethod
    def solved(cls, record: Mapping[str, Any]) -> bool | None:
        """Whether a record's answer is correct, the bit pass@k counts over sampled answers: the env's
        `solved_metric` on that record alone (None without one: the reward is graded)."""
        if not cls.solved_metric:
            return None
        return bool(cls.task_statistics([record])[cls.solved_metric].point() > 0.5)

    # --- report ----------------------------------------------------------------

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        """One line describing a record's truth in the report's gallery."""
        return ", ".join(f"{k}: {v}" for k, v in truth.items())

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        """How one answer did, in a gallery row (default: its reward components)."""
        components = record.get("reward_components") or {}
        return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in components.items())

    @classmethod
    def gallery_images(cls, images: Sequence[Any], records: Mapping[str, Mapping[str, Any] | None]) -> list:
        """The images a gallery card of reports/eval.html shows for one sample, given its record under each policy
        (None where a policy has none; in the page's policy order); an env may draw its truth and predictions on
        them (default: the images as they are)."""
        return list(images)

    @classmethod
    def report_html(cls, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], params: Any) -> str:
        """The env's own part of reports/eval.html (placed before the gallery; default: none)."""
        return ""

    @classmethod
    def write_report_files(cls, out_root: Path, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                           params: Any) -> tuple[dict[str, Path], dict[str, Path]]:
        """Write the env's plots and data files under out_root; returns ({role: path}, {caption: PNG embedded in
        the page}) (default: none)."""
        return {}, {}
