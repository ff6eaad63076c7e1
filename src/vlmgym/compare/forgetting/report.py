"""The report stage of a forgetting study: every run's answers -> studies/<name>/report.md, report.json, report.png.

What the report holds and how to read it: docs/forgetting.md. The figures also go onto the study's MLflow parent
run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vlmgym.compare.forgetting import kl
from vlmgym.compare.forgetting.figures import results as study_results
from vlmgym.compare.forgetting.plot import plot
from vlmgym.compare.forgetting.runs import constants, read_seed
from vlmgym.compare.forgetting.settings import ForgettingStudy


def _number(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _cell(figure: dict[str, Any], signed: bool = False) -> str:
    """mean [low, high], or the mean alone for one seed."""
    mean = _number(figure["mean"], signed)
    if figure["ci_low"] is None:
        return mean
    return f"{mean} [{_number(figure['ci_low'], signed)}, {_number(figure['ci_high'], signed)}]"


def introduction(study: ForgettingStudy, sections: dict[str, Any], parts: list[str], confidence: float) -> list[str]:
    n, level = len(study.seeds), f"{100 * confidence:.0f}%"
    methods = list(dict.fromkeys(study.method(p) for p in study.points))
    return [f"# Forgetting study {study.name}: {' and '.join(methods)} teaching a new skill to a generalist "
            f"({n} seed{'s' if n > 1 else ''})", "",
            f"Seeds {', '.join(map(str, study.seeds))}: every seed the settings name. Each seed trains its own "
            f"generalist (the sft section of `{study.base_params}` with `generalist: "
            f"{json.dumps(dict(study.generalist))}`, trained on {', '.join(parts)} at once from "
            f"`{sections['sft'].init_dir}`), then every sweep point from it on the new skill "
            f"(`{study.new_skill}` with {json.dumps(dict(study.new_skill_settings))}), each ending on "
            f"`validation.select: {study.select}`.", "",
            "Gain: a point's greedy mean reward on the new skill's test split minus its generalist's. Change: its "
            "mean reward on each old skill's held-out split minus its generalist's, averaged over the old skills "
            "(negative: forgotten). KL: on the new skill's test prompts, from "
            f"{kl.DIRECTIONS['policy_to_generalist']} and {kl.DIRECTIONS['generalist_to_policy']}, "
            "a Monte Carlo mean of the log-ratio of whole answers at temperature 1.", "",
            f"Intervals: {level} t-interval over the seeds' own values (each already a difference from that seed's "
            "generalist), mean ± t(n-1) · sd / √n." if n > 1 else "One seed: no interval over seeds.", "",
            f"Settings: `{study.params_file}` (committed before the study ran).", ""]


def generalist_section(figures: dict[str, Any]) -> list[str]:
    lines = ["## The generalist", "", "Each old skill: the generalist, the same SFT on that skill alone "
             "(`single`), the generalist with every image blanked (`blind`) and the best constant answer.", "",
             "| skill | split | generalist | single | blind | constant | generalist - single | generalist - blind |",
             "|---|---|---|---|---|---|---|---|"]
    for part, by_split in figures["old"].items():
        for split, f in by_split.items():
            lines.append(f"| {part} | {split} | {_cell(f['generalist'])} | {_cell(f['single'])} | {_cell(f['blind'])}"
                         f" | {_number(f['constant'])} | {_cell(f['generalist_minus_single'], True)} | "
                         f"{_cell(f['generalist_minus_blind'], True)} |")
    new = figures["new"]
    lines += ["", f"The new skill before any teaching (test): greedy {_cell(new['greedy'])}, sampled mean "
              f"{_cell(new['sampled_mean_reward'])}, best-of-{new['k']:.0f} {_cell(new['best_of_k_reward'])}; the "
              f"best constant answer {_number(new['constant'])}. A best-of-k above the greedy reward is what RL can "
              "reinforce.", ""]
    if figures["val"]:
        lines += ["Each old skill's greedy val reward along the generalist's training (mean over seeds): levelled "
                  "off where the last values agree.", "", "| skill | " + " | ".join(
                      f"step {step:.0f}" for step, _ in next(iter(figures["val"].values()))[-4:]) + " |",
                  "|---|" + "---|" * len(next(iter(figures["val"].values()))[-4:])]
        lines += [f"| {part} | " + " | ".join(_number(v) for _, v in history[-4:]) + " |"
                  for part, history in figures["val"].items()]
        lines.append("")
    return lines


def points_section(figures: dict[str, Any], splits: list[str]) -> list[str]:
    lines = ["## Each sweep point", "", "| point | method | settings | gain | " + " | ".join(
        f"change, {s}" for s in splits) + " | KL(pi ‖ gen) | KL(gen ‖ pi) | steps (selected) |",
             "|---|---|---|---|" + "---|" * len(splits) + "---|---|---|"]
    for name, f in figures.items():
        ended = ", ".join(f"{s:.0f}" if sel is None else f"{sel:.0f}/{s:.0f}"
                          for s, sel in zip(f["steps"], f["selected_step"]))
        lines.append(f"| {name} | {f['method']} | `{json.dumps(f['settings'])}` | {_cell(f['gain'], True)} | "
                     + " | ".join(_cell(f["change"][s], True) for s in splits)
                     + f" | {_cell(f['kl']['policy_to_generalist'])} | {_cell(f['kl']['generalist_to_policy'])} | "
                     f"{ended} |")
    lines += ["", "Change on each old skill:", "", "| point | " + " | ".join(
        f"{part}, {split}" for part, by in next(iter(figures.values()))["change_per_skill"].items() for split in by)
        + " |"]
    first = next(iter(figures.values()))["change_per_skill"]
    lines.append("|---|" + "---|" * sum(len(by) for by in first.values()))
    for name, f in figures.items():
        lines.append(f"| {name} | " + " | ".join(_cell(c, True) for by in f["change_per_skill"].values()
                                                for c in by.values()) + " |")
    return [*lines, ""]


def matched_section(matched: dict[str, list], splits: list[str]) -> list[str]:
    lines = ["## Old-skill change at matched new-skill gain", "", "Each seed's curve (its generalist at 0, then each "
             "of the method's points) interpolated linearly at gains every seed's curve of every method reaches, "
             "then paired by seed.", ""]
    for split in splits:
        rows = matched[split]
        if not rows:
            lines += [f"{split}: no matched gain: some seed's curve of some method gains nothing on the new skill.",
                      ""]
            continue
        keys = [k for k in rows[0] if k != "gain"]
        lines += [f"| {split}: gain | " + " | ".join(k.replace("_minus_", " - ") for k in keys) + " |",
                  "|---|" + "---|" * len(keys)]
        lines += [f"| {_number(row['gain'], True)} | " + " | ".join(_cell(row[k], True) for k in keys) + " |"
                  for row in rows]
        lines.append("")
    return lines


def predicts_section(predicts: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["## Does the KL predict forgetting?", "", "Pearson's r between a run's KL to its generalist and its "
             "forgetting (minus its change) over every sweep run: pooled, with the Fisher z-interval (which counts "
             "the runs as independent), and each seed's own r with the t-interval over seeds.", "",
             "| split | KL | pooled r | runs | slope | r per seed |", "|---|---|---|---|---|---|"]
    for split, by_direction in predicts.items():
        for direction, f in by_direction.items():
            pooled = (f"{_number(f['pooled_r'], True)} [{_number(f['pooled_ci_low'], True)}, "
                      f"{_number(f['pooled_ci_high'], True)}]")
            lines.append(f"| {split} | {direction} | {pooled} | {f['runs']} | {_number(f['slope'], True)} | "
                         f"{_cell(f['per_seed_r'], True)} |")
    return [*lines, ""]


def write(study: ForgettingStudy, sections: dict[str, Any]) -> tuple[dict[str, Path], dict[str, Any]]:
    from vlmgym.runtime.atomic import write_text_atomically

    confidence = sections["eval"].confidence
    parts = study.old_skills(sections)
    seeds = [read_seed(study, seed, parts) for seed in study.seeds]
    figures = study_results(study, seeds, parts, constants(study, parts), confidence)
    lines = [*introduction(study, sections, parts, confidence), *generalist_section(figures["generalist"]),
             *points_section(figures["points"], figures["splits"]),
             *matched_section(figures["matched"], figures["splits"]),
             *predicts_section(figures["kl_predicts_forgetting"])]
    files = {kind: study.folder / f"report.{kind}" for kind in ("md", "json", "png")}
    write_text_atomically(files["md"], "\n".join(lines))
    summary = {"study": study.name, "env": study.env, "old_skills": parts, "new_skill": study.new_skill,
               "new_skill_settings": dict(study.new_skill_settings), "seeds": list(study.seeds),
               "select": study.select, "confidence": confidence,
               "interval": "t over seeds" if len(study.seeds) > 1 else "none (one seed)", **figures}
    write_text_atomically(files["json"], json.dumps(summary, indent=1, sort_keys=True) + "\n")
    plot(files["png"], figures, confidence, len(study.seeds))
    return files, figures


def metrics(figures: dict[str, Any]) -> dict[str, float]:
    """The headline figures for the study's MLflow parent run."""
    out = {}
    for point, f in figures["points"].items():
        for name, figure in [("gain", f["gain"]), *((f"change_{s}", c) for s, c in f["change"].items()),
                             *((f"kl_{d}", k) for d, k in f["kl"].items())]:
            if figure["mean"] is not None:
                out[f"{point}/{name}"] = figure["mean"]
    return out


def report(study: ForgettingStudy) -> dict[str, Path]:
    """The report stage: the report as one MLflow run under the study's parent, which gets its figures."""
    from vlmgym.compare.stages import tracked

    sections = study.sections()
    with tracked(study, "report", {}, sections["eval"]) as run:
        files, figures = write(study, sections)
        headline = metrics(figures)
        run.log_metrics(headline)
        run.log_pipeline_results(headline)
        for path in files.values():
            run.log_artifact(path)
    print(f"report: {files['md']}, {files['json'].name}, {files['png'].name}", flush=True)
    return files
