"""Everything the evaluate stage writes, from rollout records: metrics JSON (every figure, and the headline's few),
tables, plots data, PNGs, HTML."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from vlmgym.envs.base import Env
from vlmgym.eval.blind import HEADLINE, blind_check, blind_comparisons
from vlmgym.eval.metrics import COLLAPSE_TOP_SHARE, answer_spread, collapsed, env_class, evaluate_policies
from vlmgym.eval.records import write_metrics_json
from vlmgym.eval.report import write_html, write_markdown
from vlmgym.params import EnvParams
from vlmgym.stats.plots import (
    RewardCurves,
    best_validation,
    plot_reward_curve_png,
    write_level_curves_csv,
    write_reward_curve_csv,
    write_validation_csv,
)

BLIND_HEADING = ("Image-blind check (each trained policy minus each baseline, mean reward: a policy that uses the "
                 "image lies above 0)")


@dataclass(frozen=True)
class EvaluationOutputs:
    """The metrics (as in metrics/eval.json), every file written, by role, and the headline figures: each name in
    metrics/headline.json -> the (results key, metric) it is."""

    results: dict[str, dict[str, float]]
    files: dict[str, Path] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # e.g. a trained policy that collapsed to one answer
    headline: dict[str, tuple[str, str]] = field(default_factory=dict)


def answer_collapse(records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                    start_policies: Sequence[str] = (),
                    threshold: float = COLLAPSE_TOP_SHARE) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per policy, how varied its greedy answers are (vlmgym.eval.metrics.answer_spread), and a warning for each
    trained policy (not in `start_policies`, the untrained start model) whose top answer covers >= `threshold`."""
    spreads, warnings = {}, []
    for policy, records in records_by_policy.items():
        spread = answer_spread([r.get("answer") for r in records])
        spreads[policy] = spread
        if policy not in start_policies and collapsed(spread, threshold):
            warnings.append(f"policy {policy!r} gives the answer {spread['top_answer']!r} to "
                            f"{100 * spread['top_share']:.1f}% of its {len(records)} samples (collapse threshold "
                            f"{100 * threshold:.0f}%): it answers without looking at the input, so its metrics are "
                            "those of a constant answer")
    return spreads, warnings


def mlflow_metrics(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{policy: {metric: v}} -> {"policy/metric": v}, the names the evaluate run logs."""
    return {f"{policy}/{name}": value for policy, metrics in results.items() for name, value in metrics.items()}


def main_metric(env: type[Env]) -> str:
    """The env's main score: the statistic that counts its correct answers (Env.solved_metric), else the first row of
    its report table (Env.metric_rows); "" when it has neither."""
    return env.solved_metric or next(iter(env.metric_rows), "")


def headline_figures(env: type[Env], results: Mapping[str, Mapping[str, float]], policies: Sequence[str],
                     comparisons: Sequence[tuple[str, str]] = (),
                     baselines: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """The few figures metrics/headline.json holds, chosen from `results` (as write_evaluation computes them): name
    in the file -> (results key, metric).

    - `<policy>`: each policy's mean reward; `<policy>_lo`, `<policy>_hi`: its interval, for the policies the
      comparisons name (every policy when there is none);
    - `<a>-<b>`, `<a>-<b>_lo`, `<a>-<b>_hi`: each comparison's paired difference of mean reward and its interval;
    - `<b>-<baseline>`: each comparison's control minus each image-blind baseline (the constant answer, itself with
      blanked images), mean reward: the control is where the treatment starts, and its margin says whether that
      start reads the image at all;
    - `format_valid`: the format-valid rate of the first comparison's treatment (the last policy without one);
    - that policy's main score (main_metric) under the env's own name for it, where the env has one.

    The names are short because `dvc metrics show` prints one column per name: the default pipeline's 14 fit in
    200 columns, where metrics/eval.json's thousand do not."""
    pairs = [(a, b) for a, b in comparisons if f"{a}_minus_{b}" in results]
    compared = {policy for pair in pairs for policy in pair}
    figures: dict[str, tuple[str, str]] = {}

    def add(name: str, key: str, metric: str) -> None:
        if name in figures:
            raise ValueError(f"metrics/headline.json: {name!r} names both {figures[name]} and {(key, metric)}; "
                             "rename the policy")
        figures[name] = (key, metric)

    for policy in policies:
        add(policy, policy, HEADLINE)
        if policy in compared or not pairs:
            add(f"{policy}_lo", policy, f"{HEADLINE}_ci_low")
            add(f"{policy}_hi", policy, f"{HEADLINE}_ci_high")
    for a, b in pairs:
        add(f"{a}-{b}", f"{a}_minus_{b}", HEADLINE)
        add(f"{a}-{b}_lo", f"{a}_minus_{b}", f"{HEADLINE}_ci_low")
        add(f"{a}-{b}_hi", f"{a}_minus_{b}", f"{HEADLINE}_ci_high")
    for control in dict.fromkeys(b for _, b in pairs):
        for baseline in baselines:
            if f"{control}_minus_{baseline}" in results:
                add(f"{control}-{baseline}", f"{control}_minus_{baseline}", HEADLINE)
    lead = pairs[0][0] if pairs else policies[-1]
    add("format_valid", lead, "format_valid_rate")
    score = main_metric(env)
    if score and score in results[lead]:
        add(score, lead, score)
    return figures


def headline_values(results: Mapping[str, Mapping[str, float]],
                    figures: Mapping[str, tuple[str, str]]) -> dict[str, float]:
    """{name: value} of the headline figures (headline_figures), as metrics/headline.json holds them."""
    return {name: results[key][metric] for name, (key, metric) in figures.items()}


def headline_summary(values: Mapping[str, float], report: str | Path) -> str:
    """A few lines for the terminal from the headline figures (headline_values): each figure with an interval as
    `value [lo, hi]`, the rest as `name value`, then where the whole report is."""
    lines = [f"test {HEADLINE.replace('_', ' ')}, 95% bootstrap intervals (a-b: paired on the same samples):"]
    rest = []
    for name, value in values.items():
        if name.endswith(("_lo", "_hi")) and name[:-3] in values:
            continue
        signed = "+" if "-" in name else ""  # a difference shows its sign
        if f"{name}_lo" in values and f"{name}_hi" in values:
            lines.append(f"  {name:<16} {value:{signed}.3f} [{values[f'{name}_lo']:{signed}.3f}, "
                         f"{values[f'{name}_hi']:{signed}.3f}]")
        else:
            rest.append(f"{name} {value:{signed}.3f}" if abs(value) < 100 else f"{name} {value:.0f}")
    if rest:
        lines.append("  " + ", ".join(rest))
    lines.append(f"every metric, interval and check: {report}")
    return "\n".join(lines)


def headline_metrics(outputs: EvaluationOutputs) -> dict[str, float]:
    """The headline figures under the names the evaluate run logs them by (mlflow_metrics: "<key>/<metric>"), for
    the pipeline's parent run, whose row in MLflow's table is then as short as `dvc metrics show`."""
    return {f"{key}/{metric}": outputs.results[key][metric] for key, metric in outputs.headline.values()}


def write_evaluation(env: type[Env] | str, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                     images: Mapping[str, Sequence[Image.Image]], *, out_root: str | Path = ".",
                     reward_curve: RewardCurves | Sequence[tuple[int, float]] | None = None,
                     comparisons: Sequence[tuple[str, str]] = (("grpo", "sft"),), n_resamples: int = 1000,
                     seed: int = 0, confidence: float = 0.95, max_samples: int | None = 200,
                     env_params: EnvParams | None = None, metric_options: Mapping[str, Any] | None = None,
                     title: str = "vlmgym evaluation",
                     extra_metrics: Mapping[str, Mapping[str, float]] | None = None,
                     start_policies: Sequence[str] = (),
                     ood_records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                     ood_split: str = "test_ood", in_split: str = "test",
                     ood_note: str | None = None,
                     baseline_records: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                     ood_baseline_records: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                     ) -> EvaluationOutputs:
    """Compute every metric and write the stage's outputs under `out_root` (each file atomically).

    `env` is an Env class or name; `env_params` its own params section (None: its defaults), `metric_options`
    keyword arguments of its Env.task_statistics. Files: metrics/eval.json, metrics/headline.json (a few of its
    figures: headline_figures), reports/eval.md, reports/eval.html,
    the env's own plots (Env.write_report_files, e.g. a distance CDF), metrics/plots/train_reward.csv and
    reports/train_reward.png (when `reward_curve` is given: the total alone, or RewardCurves whose per-level
    curves also go to metrics/plots/train_reward_levels.csv and beside the total in the PNG, and whose validation
    curves go to metrics/plots/val_reward.csv and onto the total's panel). `extra_metrics`
    ({key: {figure: value}}, e.g. the HF baseline) go into metrics/eval.json under their keys and into both
    reports as their own tables.
    `ood_records_by_policy` (the greedy records of the env's out-of-distribution split `ood_split`) get the same
    metrics and comparisons, under `<policy>_<ood_split>` keys (e.g. `sft_test_ood`, `grpo_minus_sft_test_ood`),
    and both reports a table of each column in-distribution (`in_split`) and out of it, side by side, headed by
    `ood_note` (what the split shifts; None: the env's Env.ood_note).
    Every policy also gets `answers_distinct_share` and `answers_top_share` (the answer collapse check, see
    answer_collapse; `start_policies` are exempt from its warnings), and both reports an "Answer collapse check"
    table; the warnings are returned in EvaluationOutputs.warnings.
    `baseline_records` (and `ood_baseline_records`), the image-blind baselines' records (vlmgym.eval.blind), get the
    same metrics and columns; each trained policy minus each baseline goes into metrics/eval.json and the reports'
    "Image-blind check", with a warning where the mean-reward difference's interval does not lie above 0. They are
    left out of the gallery and the env's plots.
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
    baselines = dict(baseline_records or {})
    pairs = blind_comparisons(list(records_by_policy), list(baselines), start_policies)
    blind_keys = {f"{a}_minus_{b}" for a, b in pairs}
    options = dict(n_resamples=n_resamples, seed=seed, confidence=confidence, **(metric_options or {}))
    results = evaluate_policies(env, {**records_by_policy, **baselines}, comparisons=[*comparisons, *pairs],
                                **options)
    ood_results = {}
    if ood_records_by_policy:
        ood_results = evaluate_policies(env, {**ood_records_by_policy, **(ood_baseline_records or {})},
                                        comparisons=[*comparisons, *pairs], **options)
    spreads, warnings = answer_collapse({**records_by_policy, **baselines}, [*start_policies, *baselines])
    for policy, spread in spreads.items():
        results[policy]["answers_distinct_share"] = spread["distinct_share"]
        results[policy]["answers_top_share"] = spread["top_share"]
    files = {"metrics": root / "metrics" / "eval.json", "headline": root / "metrics" / "headline.json",
             "table": root / "reports" / "eval.md", "html": root / "reports" / "eval.html"}
    sections = {key: dict(values) for key, values in (extra_metrics or {}).items()}
    ood_keyed = {f"{key}_{ood_split}": values for key, values in ood_results.items()}
    write_metrics_json(files["metrics"], {**results, **ood_keyed, **sections})
    headline = headline_figures(env, results, list(records_by_policy), comparisons, list(baselines))
    write_metrics_json(files["headline"], headline_values(results, headline))
    collapse = collapse_section(spreads, warnings)
    blind_figures, blind_warnings = blind_check(results, pairs, in_split)
    ood_figures, ood_warnings = blind_check(ood_results, pairs, ood_split)
    if pairs:
        collapse[BLIND_HEADING] = {**blind_figures, **ood_figures, **{
            f"warning {i}": text for i, text in enumerate(blind_warnings + ood_warnings, start=1)}}
    warnings = warnings + blind_warnings + ood_warnings
    shown = {key: values for key, values in results.items() if key not in blind_keys}
    tables = {}
    if ood_results:
        tables[shift_heading(env, in_split, ood_split, ood_note)] = side_by_side(
            shown, {k: v for k, v in ood_results.items() if k not in blind_keys}, in_split, ood_split)
    write_markdown(files["table"], env, shown, title=f"{title} ({env.name})", confidence=confidence,
                   sections={**sections, **collapse}, tables=tables)
    env_files, figures = env.write_report_files(root, records_by_policy, env_params)
    files.update(env_files)
    curves = reward_curve if isinstance(reward_curve, RewardCurves) else RewardCurves(total=reward_curve or ())
    notes = {}
    if curves.total:
        files["train_reward"] = root / "metrics" / "plots" / "train_reward.csv"
        files["train_reward_png"] = root / "reports" / "train_reward.png"
        write_reward_curve_csv(files["train_reward"], curves.total)
        if curves.levels or curves.weights:
            files["train_reward_levels"] = root / "metrics" / "plots" / "train_reward_levels.csv"
            write_level_curves_csv(files["train_reward_levels"], curves)
        if curves.validation:
            files["val_reward"] = root / "metrics" / "plots" / "val_reward.csv"
            write_validation_csv(files["val_reward"], curves)
        plot_reward_curve_png(files["train_reward_png"], curves)
        figures = {**figures, "Training reward": files["train_reward_png"]}
        notes["Training reward"] = reward_curve_note(curves)
    write_html(files["html"], env, shown, records_by_policy, images, env_params=env_params, title=title,
               confidence=confidence, max_samples=max_samples, sections={**sections, **collapse}, figures=figures,
               figure_notes=notes, tables=tables)
    return EvaluationOutputs({**results, **ood_keyed, **sections}, files, warnings, headline)


def side_by_side(results: Mapping[str, Mapping[str, float]], ood_results: Mapping[str, Mapping[str, float]],
                 in_split: str, ood_split: str) -> dict[str, Mapping[str, float]]:
    """Results columns in pairs: each policy (and difference) on `in_split`, then on `ood_split`."""
    columns: dict[str, Mapping[str, float]] = {}
    for key in results:
        if key in ood_results:
            columns[f"{key} ({in_split})"] = results[key]
            columns[f"{key} ({ood_split})"] = ood_results[key]
    return columns


def shift_heading(env: type[Env], in_split: str, ood_split: str, note: str | None = None) -> str:
    """The side-by-side table's heading, naming the shift (`note`: Env.ood_description of the data settings the split
    was generated with; None: the env's general Env.ood_note)."""
    note = note or env.ood_note or "the env's out-of-distribution split"
    return f"In distribution ({in_split}) and out of it ({ood_split}: {note})"


def collapse_section(spreads: Mapping[str, Mapping[str, Any]], warnings: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The reports' "Answer collapse check" table: each policy's top answer, its share, the distinct answers' share,
    then the warnings (kept out of metrics/eval.json, whose values are numbers)."""
    figures: dict[str, Any] = {}
    for policy, spread in spreads.items():
        figures[f"{policy}: top answer"] = repr(spread["top_answer"])
        figures[f"{policy}: top answer share"] = f"{100 * spread['top_share']:.1f}%"
        figures[f"{policy}: distinct answers share"] = f"{100 * spread['distinct_share']:.1f}%"
    figures.update({f"warning {i}": text for i, text in enumerate(warnings, start=1)})
    return {f"Answer collapse check (warning at top answer share >= {100 * COLLAPSE_TOP_SHARE:.0f}%)": figures}


def reward_curve_note(curves: RewardCurves) -> str:
    """What the training reward figure shows, under its heading in reports/eval.html."""
    note = "The mean reward of each training step's sampled answers: what the policy is trained on."
    if curves.as_trained:
        note = ("The mean reward of each training step's sampled answers, scored at the curriculum's final weights "
                "(one yardstick for every step), beside the same answers scored as trained, at that step's weights.")
    if curves.levels:
        note += " It is a weighted total of the reward's levels; beside it, each level's own score, unweighted."
    if curves.weights:
        note += (" Then the levels' weights in the total: when a curriculum moves weight to harder levels, the total "
                 "falls while each level holds or improves, so read learning from the levels"
                 + (" or from the final-weights total." if curves.as_trained else "."))
    best = best_validation(curves)
    if best is not None:
        note += (" Dots: the mean reward on the val split (held out of train, not the test split), greedy and "
                 f"sampled, at the final weights; the best greedy one was at step {best[0]} ({best[1]:.4f}), the "
                 "model a run with train.validation.select: best_val keeps.")
    return note
