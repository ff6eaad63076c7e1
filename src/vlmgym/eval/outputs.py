"""Everything the evaluate stage writes, from rollout records: metrics JSON, tables, plots data, PNGs, HTML."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.eval.metrics import ReverseGeocoder, evaluate_policies, sample_distances_km
from vlmgym.eval.plots import (
    plot_distance_cdf_png,
    plot_reward_curve_png,
    write_distance_cdf_csv,
    write_reward_curve_csv,
)
from vlmgym.eval.records import write_metrics_json
from vlmgym.eval.report import basemap_points, write_html, write_markdown


@dataclass(frozen=True)
class EvaluationOutputs:
    """The metrics (as in metrics/eval.json) and every file written, by role."""

    results: dict[str, dict[str, float]]
    files: dict[str, Path] = field(default_factory=dict)


def mlflow_metrics(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{policy: {metric: v}} -> {"policy/metric": v}, the names the evaluate run logs."""
    return {f"{policy}/{name}": value for policy, metrics in results.items() for name, value in metrics.items()}


def write_evaluation(env: str, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                     images: Mapping[str, Sequence[Image.Image]], *, out_root: str | Path = ".",
                     reward_curve: Sequence[tuple[int, float]] | None = None,
                     comparisons: Sequence[tuple[str, str]] = (("grpo", "sft"),), n_resamples: int = 1000,
                     seed: int = 0, confidence: float = 0.95, max_samples: int | None = 200,
                     map_base_points: int = 4000, reverse_geocoder: ReverseGeocoder | None = None,
                     title: str = "vlmgym evaluation",
                     extra_metrics: Mapping[str, Mapping[str, float]] | None = None) -> EvaluationOutputs:
    """Compute every metric and write the stage's outputs under `out_root` (each file atomically).

    Files: metrics/eval.json, reports/eval.md, reports/eval.html, metrics/plots/distance_cdf.csv and
    reports/distance_cdf.png (geospot), metrics/plots/train_reward.csv and reports/train_reward.png
    (when `reward_curve` is given). `extra_metrics` ({key: {figure: value}}, e.g. the HF baseline) go into
    metrics/eval.json under their keys and into both reports as their own tables.
    """
    clash = sorted(set(extra_metrics or {}) & set(records_by_policy))
    if clash:
        raise ValueError(f"write_evaluation: extra metrics keys {clash} clash with policy names")
    if not records_by_policy:
        raise ValueError("write_evaluation: no policies to evaluate")
    root = Path(out_root)
    results = evaluate_policies(env, records_by_policy, comparisons=comparisons, n_resamples=n_resamples, seed=seed,
                                confidence=confidence, reverse_geocoder=reverse_geocoder)
    files = {"metrics": root / "metrics" / "eval.json", "table": root / "reports" / "eval.md",
             "html": root / "reports" / "eval.html"}
    sections = {key: dict(values) for key, values in (extra_metrics or {}).items()}
    write_metrics_json(files["metrics"], {**results, **sections})
    write_markdown(files["table"], results, title=f"{title} ({env})", confidence=confidence, sections=sections)
    if env == "geospot":
        distances = {policy: sample_distances_km(records) for policy, records in records_by_policy.items()}
        files["distance_cdf"] = root / "metrics" / "plots" / "distance_cdf.csv"
        files["distance_cdf_png"] = root / "reports" / "distance_cdf.png"
        write_distance_cdf_csv(files["distance_cdf"], distances)
        plot_distance_cdf_png(files["distance_cdf_png"], distances)
    if reward_curve:
        files["train_reward"] = root / "metrics" / "plots" / "train_reward.csv"
        files["train_reward_png"] = root / "reports" / "train_reward.png"
        write_reward_curve_csv(files["train_reward"], reward_curve)
        plot_reward_curve_png(files["train_reward_png"], reward_curve)
    basemap = basemap_points(map_base_points) if env == "geospot" and map_base_points > 0 else None
    figures = {caption: files[key] for caption, key in (("Distance CDF", "distance_cdf_png"),
                                                          ("Training reward", "train_reward_png")) if key in files}
    write_html(files["html"], env, results, records_by_policy, images, basemap=basemap, title=title,
               confidence=confidence, max_samples=max_samples, sections=sections, figures=figures)
    return EvaluationOutputs({**results, **sections}, files)
