"""Everything the evaluate stage writes, from rollout records: metrics JSON, tables, plots data, PNGs, HTML."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.eval.metrics import env_class, evaluate_policies
from vlmgym.eval.plots import plot_reward_curve_png, write_reward_curve_csv
from vlmgym.eval.records import write_metrics_json
from vlmgym.eval.report import write_html, write_markdown


@dataclass(frozen=True)
class EvaluationOutputs:
    """The metrics (as in metrics/eval.json) and every file written, by role."""

    results: dict[str, dict[str, float]]
    files: dict[str, Path] = field(default_factory=dict)


def mlflow_metrics(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{policy: {metric: v}} -> {"policy/metric": v}, the names the evaluate run logs."""
    return {f"{policy}/{name}": value for policy, metrics in results.items() for name, value in metrics.items()}


def write_evaluation(env: Any, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                     images: Mapping[str, Sequence[Image.Image]], *, out_root: str | Path = ".",
                     reward_curve: Sequence[tuple[int, float]] | None = None,
                     comparisons: Sequence[tuple[str, str]] = (("grpo", "sft"),), n_resamples: int = 1000,
                     seed: int = 0, confidence: float = 0.95, max_samples: int | None = 200,
                     env_params: Any = None, metric_options: Mapping[str, Any] | None = None,
                     title: str = "vlmgym evaluation",
                     extra_metrics: Mapping[str, Mapping[str, float]] | None = None) -> EvaluationOutputs:
    """Compute every metric and write the stage's outputs under `out_root` (each file atomically).

    `env` is an Env class or name; `env_params` its own params section (None: its defaults), `metric_options`
    keyword arguments of its Env.task_statistics. Files: metrics/eval.json, reports/eval.md, reports/eval.html,
    the env's own plots (Env.write_report_files, e.g. a distance CDF), metrics/plots/train_reward.csv and
    reports/train_reward.png (when `reward_curve` is given). `extra_metrics` ({key: {figure: value}}, e.g. the HF
    baseline) go into metrics/eval.json under their keys and into both reports as their own tables.
    """
    env = env_class(env)
    if env_params is None and env.Params is not None:
        env_params = env.Params()
    clash = sorted(set(extra_metrics or {}) & set(records_by_policy))
    if clash:
        raise ValueError(f"write_evaluation: extra metrics keys {clash} clash with policy names")
    if not records_by_policy:
        raise ValueError("write_evaluation: no policies to evaluate")
    root = Path(out_root)
    results = evaluate_policies(env, records_by_policy, comparisons=comparisons, n_resamples=n_resamples, seed=seed,
                                confidence=confidence, **(metric_options or {}))
    files = {"metrics": root / "metrics" / "eval.json", "table": root / "reports" / "eval.md",
             "html": root / "reports" / "eval.html"}
    sections = {key: dict(values) for key, values in (extra_metrics or {}).items()}
    write_metrics_json(files["metrics"], {**results, **sections})
    write_markdown(files["table"], env, results, title=f"{title} ({env.name})", confidence=confidence,
                   sections=sections)
    env_files, figures = env.write_report_files(root, records_by_policy, env_params)
    files.update(env_files)
    if reward_curve:
        files["train_reward"] = root / "metrics" / "plots" / "train_reward.csv"
        files["train_reward_png"] = root / "reports" / "train_reward.png"
        write_reward_curve_csv(files["train_reward"], reward_curve)
        plot_reward_curve_png(files["train_reward_png"], reward_curve)
    if "train_reward_png" in files:
        figures = {**figures, "Training reward": files["train_reward_png"]}
    write_html(files["html"], env, results, records_by_policy, images, env_params=env_params, title=title,
               confidence=confidence, max_samples=max_samples, sections=sections, figures=figures)
    return EvaluationOutputs({**results, **sections}, files)
