"""The docs' study tables, generated from the studies' committed reports (studies/<name>/report.json).

A block in README.md or a page under docs/

    <!-- study-table: NAME -->
    (generated: edits are overwritten)
    <!-- /study-table -->

holds study NAME's headline tables: every arm's mean reward and each RL arm's paired differences against the start and
against each SFT control, per split, with the report's interval (bold where it excludes 0), then greedy, sampled mean
and best-of-k reward on test where the runs sampled. A block

    <!-- study-summary: NAME NAME ... -->
    <!-- /study-summary -->

holds one table over several studies (one env each): per study and split, its seeds, every arm's mean reward, the
start against the image-blind baselines and each RL arm against the start and each SFT control. A block

    <!-- eval-table: ENV metrics/eval.json COLUMN COLUMN ... -->
    <!-- /eval-table -->

holds one run's evaluation table, as the evaluate stage writes it into reports/eval.md, from the git-tracked metrics
file it writes beside it: env ENV's metrics (rows) for the named policies and differences (columns) of its test split.
`vlmgym study tables` rewrites every block from the reports; `--check` only lists the blocks that differ (exit 1),
which the test suite runs, so no result row is typed by hand.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlmgym.compare.tables import shown

BLOCK = re.compile(r"(<!-- (?P<kind>study-table|study-summary|eval-table): "
                   r"(?P<name>[A-Za-z0-9_./-]+(?: [A-Za-z0-9_./-]+)*) -->\n)(?P<body>.*?)(<!-- /(?P=kind) -->)", re.S)
STUDY_KINDS = ("study-table", "study-summary")
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)  # a block shown in a code example is not one to fill
PAGES = ("README.md", "docs")
SAMPLED = (("mean_reward", "greedy"), ("sampled_mean_reward", "sampled mean, k sampled"),
           ("best_of_k_reward", "best-of-k"))


def report_file(root: Path, name: str) -> Path:
    return root / "studies" / name / "report.json"


def _cell(flat: Mapping[str, float], key: str, signed: bool, seeds: int) -> str:
    """A mean over seeds with its t-interval; a difference bold where that interval excludes 0."""
    from vlmgym.eval.report import format_value

    value = format_value(flat[key], "reward", signed)
    if seeds < 2 or f"{key}_ci_low" not in flat:
        return value
    low, high = flat[f"{key}_ci_low"], flat[f"{key}_ci_high"]
    text = f"{value} [{format_value(low, 'reward', signed)}, {format_value(high, 'reward', signed)}]"
    return f"**{text}**" if signed and (low > 0 or high < 0) else text


def differences(report: Mapping[str, Any]) -> list[str]:
    """The report's differences that involve an arm (not the start against the image-blind baselines)."""
    return [f"{arm}_minus_sft" for arm in report["arms"]] + list(report["comparisons"])


def table(report: Mapping[str, Any], name: str, link: str | None = None) -> str:
    """Study `name`'s headline tables (markdown) from its report.json's content; `link`: the full report's path
    from the page (default: from the repository root)."""
    seeds, results = len(report["seeds"]), report["results"]
    policies = ["sft", *report["arms"]]
    diffs = differences(report)
    header = ["split", *policies, *(shown(d) for d in diffs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for split, split_results in results.items():
        cells = [_cell(split_results[p], "mean_reward", False, seeds) for p in policies]
        cells += [_cell(split_results[d], "mean_reward", True, seeds) for d in diffs]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    level = f"{100 * report['confidence']:.0f}%"
    interval = (f"{level} t-interval over the {seeds} seeds, **bold** where it excludes 0" if seeds > 1
                else f"{level} bootstrap over test samples: one seed, no run-to-run variance")
    link = link or f"studies/{name}/report.md"
    out = [f"Mean reward (greedy) over seeds {', '.join(map(str, report['seeds']))} [{interval}]; "
           f"`{report['study']}`, env {report['env']}, every arm selected by `validation.select: "
           f"{report['select']}`; the full report: [studies/{name}/report.md]({link}).", "",
           *lines]
    test = results.get("test", {})
    if all("best_of_k_reward" in test.get(p, {}) for p in policies):
        rows = ["| test | " + " | ".join([*policies, *(shown(d) for d in diffs
                                                        if d.endswith("_minus_sft"))]) + " |"]
        rows.append("|" + "---|" * (1 + len(policies) + len(report["arms"])))
        for key, label in SAMPLED:
            cells = [_cell(test[p], key, False, seeds) for p in policies]
            cells += [_cell(test[d], key, True, seeds) for d in diffs if d.endswith("_minus_sft")]
            rows.append(f"| {label} | " + " | ".join(cells) + " |")
        out += ["", "Greedy against sampled answers on test (k per prompt at the rollout's temperature): the best "
                "of k rising with greedy is new answers; greedy rising toward an unchanged best-of-k is sharpening.",
                "", *rows]
    return "\n".join(out) + "\n"


def _arms(reports: list[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """The arms over every report in order of first appearance, and their differences (each RL arm against the start,
    then the report's comparisons)."""
    arms, diffs = [], []
    for report in reports:
        arms += [arm for arm in report["arms"] if arm not in arms]
        diffs += [d for d in differences(report) if d not in diffs and not d.startswith("sft_")]
    return arms, diffs


def summary(reports: Mapping[str, Mapping[str, Any]], links: Mapping[str, str]) -> str:
    """One table over several studies (name -> report.json's content; `links`: name -> its report.md from the page):
    a row per study and split with every arm's mean and the differences' intervals; a cell a study lacks is empty."""
    arms, diffs = _arms(list(reports.values()))
    blind = ["sft_minus_constant", "sft_minus_sft_blind"]
    header = ["study (env, seeds)", "split", "sft", *arms, *(shown(d) for d in blind + diffs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, report in reports.items():
        seeds = len(report["seeds"])
        for row, (split, results) in enumerate(report["results"].items()):
            cells = [f"[{name}]({links[name]}) ({report['env']}, {seeds})" if row == 0 else "", split]
            cells += [_cell(results[p], "mean_reward", False, 1) if p in results else "" for p in ["sft", *arms]]
            cells += [_cell(results[d], "mean_reward", True, seeds) if d in results else "" for d in blind + diffs]
            lines.append("| " + " | ".join(cells) + " |")
    level = f"{100 * next(iter(reports.values()))['confidence']:.0f}%"
    return (f"Mean reward (greedy) of each arm over its study's seeds, and paired differences [{level} t-interval over "
            "the seeds, **bold** where it excludes 0]; each study's page has every metric and seed.\n\n"
            + "\n".join(lines) + "\n")


def eval_table(root: Path, args: list[str], where: Path) -> str:
    """An eval-table block's content: args ENV FILE COLUMN..., FILE a metrics/eval.json from the repository root."""
    from vlmgym.eval.report import markdown_table

    if len(args) < 3:
        raise ValueError(f"{where}: an eval-table block names an env, a metrics file and its columns, not {args}")
    env, path, columns = args[0], root / args[1], args[2:]
    if not path.is_file():
        raise FileNotFoundError(f"{where}: an eval-table block reads {path}, which does not exist (the evaluate "
                                "stage writes it)")
    results = json.loads(path.read_text())
    missing = [c for c in columns if c not in results]
    if missing:
        raise ValueError(f"{where}: an eval-table block names columns {missing} that {path} does not hold "
                         f"(it has {sorted(results)})")
    return markdown_table(env, {c: results[c] for c in columns})


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def rendered(root: Path, text: str, where: Path) -> str:
    """`text` with every generated block rewritten from its report."""
    def load(name: str) -> tuple[dict[str, Any], str]:
        path = report_file(root, name)
        if not path.is_file():
            raise FileNotFoundError(f"{where}: a study block names study {name!r}, but {path} does not exist "
                                    f"(dvc repro studies/{name}/dvc.yaml writes it)")
        link = os.path.relpath(path.with_name("report.md").resolve(), Path(where).resolve().parent)
        return json.loads(path.read_text()), Path(link).as_posix()

    def body(match: re.Match) -> str:
        names = match.group("name").split()
        if match.group("kind") == "eval-table":
            content = eval_table(root, names, where)
        elif match.group("kind") == "study-table":
            if len(names) != 1:
                raise ValueError(f"{where}: a study-table block names one study, not {names} (study-summary "
                                 "takes several)")
            report, link = load(names[0])
            content = table(report, names[0], link)
        else:
            loaded = {name: load(name) for name in names}
            content = summary({n: r for n, (r, _) in loaded.items()}, {n: link for n, (_, link) in loaded.items()})
        return match.group(1) + content + match.group(5)

    out, last = [], 0
    for fence in FENCE.finditer(text):
        out += [BLOCK.sub(body, text[last:fence.start()]), fence.group(0)]
        last = fence.end()
    return "".join([*out, BLOCK.sub(body, text[last:])])


def blocks(text: str) -> list[str]:
    """The study names of the study blocks in `text` (outside code examples)."""
    return [name for m in BLOCK.finditer(FENCE.sub("", text)) if m.group("kind") in STUDY_KINDS
            for name in m.group("name").split()]


def stale(root: Path) -> list[Path]:
    """The pages whose generated blocks differ from what the reports give."""
    out = []
    for page in pages(root):
        text = page.read_text()
        if BLOCK.search(FENCE.sub("", text)) and rendered(root, text, page) != text:
            out.append(page)
    return out


def rewrite(root: Path) -> list[Path]:
    """Rewrite every stale page; returns them."""
    from vlmgym.runtime.atomic import write_text_atomically

    changed = stale(root)
    for page in changed:
        write_text_atomically(page, rendered(root, page.read_text(), page))
    return changed
