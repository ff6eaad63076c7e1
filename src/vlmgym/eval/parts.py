"""The evaluate stage for an env made of several (vlmgym.envs.parts): each sub-env evaluated on its own, as the
single-env stage would, then gathered.

Each sub-env `<name>` reads its rollouts from `<rollouts_dir>/<name>/` and its shards from `<shards_dir>/<name>/`,
and gets its own metrics (its Env class's task_statistics and metric_rows, intervals, paired differences, the
out-of-distribution split), its own report page and plots, and its own training reward curve (the `env/<name>/...`
figures of the train stage's curve file, vlmgym.envs.base.part_metric). Written:
- metrics/eval.json: {name: that sub-env's metrics, as metrics/eval.json holds them for one env}, and
  metrics/headline.json the same way: {name: that sub-env's headline figures};
- reports/<name>/: its eval.md, eval.html and plots; metrics/plots/<name>/: its CSVs;
- reports/eval.md and reports/eval.html: one section per sub-env (its page's content, headings one level down).
The HF baseline (eval.hf_samples) runs on the first sub-env only: it checks the exported weights, not a task.
"""

from __future__ import annotations

import dataclasses
import html
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlmgym import envs
from vlmgym.envs.base import part_metric
from vlmgym.eval.outputs import EvaluationOutputs, headline_values
from vlmgym.eval.records import write_metrics_json
from vlmgym.params import DataParams, EnvParams, EvalParams, ModelParams, RolloutParams
from vlmgym.runtime.atomic import write_text_atomically


def _move_tree(src: Path, dest: Path) -> list[Path]:
    """Move every file under src to the same relative path under dest; returns the new paths."""
    moved = []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        target = dest / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    return moved


def demote_markdown(text: str) -> str:
    """Markdown with every heading one level down (a page's `# title` becomes a section's `## title`)."""
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines()) + "\n"


def html_body(page: str) -> str:
    """The content of a page's <body>, its h1/h2 headings one level down."""
    body = page[page.index("<body>") + len("<body>"): page.rindex("</body>")]
    for level in (2, 1):
        body = body.replace(f"<h{level}>", f"<h{level + 1}>").replace(f"</h{level}>", f"</h{level + 1}>")
    return body


def evaluate_parts(eval_params: EvalParams, rollout: RolloutParams, model: ModelParams, env_params: EnvParams,
                   train_curve: str | Path, evaluate_env: Callable[..., Any], out_root: str | Path = ".",
                   data: DataParams | None = None) -> tuple[EvaluationOutputs, dict[str, float]]:
    """Evaluate each sub-env (module docstring) with `evaluate_env` (vlmgym.eval.evaluate's, passed in so that this
    module needs nothing above it); returns what vlmgym.eval.evaluate.evaluate_pipeline returns, with results keyed
    `<name>/<policy>` (MLflow names `<name>/<policy>/<metric>`) and timing of the HF baseline."""

    root = Path(out_root)
    names = envs.parts(env_params)
    results: dict[str, dict[str, float]] = {}
    nested: dict[str, dict] = {}
    headlines: dict[str, dict[str, float]] = {}
    headline: dict[str, tuple[str, str]] = {}
    files: dict[str, Path] = {}
    warnings: list[str] = []
    timing: dict[str, float] = {}
    markdown, bodies, head = [], [], ""
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".evaluate-parts-") as scratch:
        for number, name in enumerate(names):
            part_eval = dataclasses.replace(eval_params, rollouts_dir=f"{eval_params.rollouts_dir}/{name}",
                                            hf_samples=eval_params.hf_samples if number == 0 else 0)
            part_rollout = dataclasses.replace(rollout, shards_dir=f"{rollout.shards_dir}/{name}")
            part_root = Path(scratch) / name
            outputs, part_timing = evaluate_env(
                part_eval, part_rollout, model, envs.part_params(env_params, name), train_curve, out_root=part_root,
                curve_prefix=part_metric(name, ""), data=data)
            timing.update({f"{name}/{k}": v for k, v in part_timing.items()})
            nested[name] = outputs.results
            headlines[name] = headline_values(outputs.results, outputs.headline)
            headline.update({f"{name}/{figure}": (f"{name}/{key}", metric)
                             for figure, (key, metric) in outputs.headline.items()})
            results.update({f"{name}/{key}": values for key, values in outputs.results.items()})
            warnings += [f"{name}: {w}" for w in outputs.warnings]
            markdown.append(demote_markdown((part_root / "reports" / "eval.md").read_text()))
            page = (part_root / "reports" / "eval.html").read_text()
            head = head or page[: page.index("<body>")]
            bodies.append(f'<section id="{name}">{html_body(page)}</section>')
            (part_root / "metrics" / "eval.json").unlink()  # gathered into the top metrics/eval.json
            for path in _move_tree(part_root / "reports", root / "reports" / name):
                files[f"{name}/{path.relative_to(root / 'reports' / name).as_posix()}"] = path
            for path in _move_tree(part_root / "metrics" / "plots", root / "metrics" / "plots" / name):
                files[f"{name}/{path.name}"] = path
    title = f"vlmgym evaluation (several envs: {', '.join(names)})"
    files["metrics"] = root / "metrics" / "eval.json"
    files["headline"] = root / "metrics" / "headline.json"
    files["table"] = root / "reports" / "eval.md"
    files["html"] = root / "reports" / "eval.html"
    write_metrics_json(files["metrics"], nested)
    write_metrics_json(files["headline"], headlines)
    intro = ("One policy trained on several envs; each section is one env's evaluation, on its own test split, "
             "as a single-env run reports it.")
    write_text_atomically(files["table"], f"# {title}\n\n{intro}\n\n" + "\n".join(markdown))
    heading = html.escape(title)
    write_text_atomically(files["html"], head.replace("<title>", f"<title>{heading} | ", 1)
                          + f"<body><h1>{heading}</h1><p>{html.escape(intro)}</p>" + "".join(bodies)
                          + "</body></html>\n")
    return EvaluationOutputs(results, files, warnings, headline), timing
