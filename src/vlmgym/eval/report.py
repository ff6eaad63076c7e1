"""The evaluation report: a markdown summary table and a self-contained HTML page (table, the env's own part such
as maps of predictions, a gallery of samples).

The HTML page references nothing outside itself: images are base64 JPEG thumbnails in data URIs,
the map is inline SVG, styles are inline. It opens from a file, offline, and as an MLflow artifact.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vlmgym.envs.base import Env
from vlmgym.envs.multiturn import MAX_TURNS
from vlmgym.eval.episode_report import episode_html
from vlmgym.eval.metrics import env_class, format_valid
from vlmgym.params import EnvParams
from vlmgym.runtime.atomic import atomic_file

THUMBNAIL_PX = 192
ANSWER_CHARS = 400  # longer answers are cut in the gallery (the rollout JSONL keeps them whole)
# Answers show in a box of at most ~6 lines that scrolls (.card pre in _STYLE): a garbage answer of many newlines
# would otherwise stretch its card, and with it the gallery's row, over a page of whitespace.

# The rows every env's table has: `n` first, the env's own rows (Env.metric_rows), then these two.
FIRST_ROWS = {"n": ("samples", "count")}
LAST_ROWS = {"format_valid_rate": ("format valid", "rate"), "mean_reward": ("mean reward", "reward"),
             # sampled answers (vlmgym.eval.sampled): k per prompt, rollout.sampled_answers
             "sampled_mean_reward": ("mean reward, k sampled", "reward"),
             "best_of_k_reward": ("best-of-k reward, k sampled", "reward"), "pass_at_k": ("pass@k, k sampled", "rate"),
             # the answer collapse check (vlmgym.eval.outputs.answer_collapse): point figures, no interval
             "answers_top_share": ("top answer share", "rate"), "answers_distinct_share": ("distinct answers", "rate"),
             # multi-turn episodes (vlmgym.eval.episodes)
             "episode_turns": ("turns per episode", "reward"),
             "tool_calls_per_episode": ("tool calls per episode", "reward"),
             "tool_call_valid_rate": ("tool calls that ran", "rate")}


def metric_rows(env: type[Env] | str) -> dict[str, tuple[str, str]]:
    """metric -> (label, unit kind) of `env`'s tables, in row order; metrics a results dict lacks are skipped."""
    turns = {f"mean_reward_turns_{k}": (f"mean reward, {k}-turn episodes", "reward") for k in range(1, MAX_TURNS + 1)}
    return {**FIRST_ROWS, **env_class(env).metric_rows, **LAST_ROWS, **turns}


def format_value(value: float | None, kind: str, signed: bool = False, like: float | None = None) -> str:
    """One metric value for a table: rates as %, km and scores rounded (as precisely as `like`); nan/None as n/a."""
    if value is None or not math.isfinite(value):
        return "n/a"
    sign = "+" if signed else ""
    if kind == "rate":
        return f"{100 * value:{sign}.1f}%"
    if kind in ("km", "score"):
        reference = value if like is None or not math.isfinite(like) else like
        return f"{value:{sign}.0f}" if abs(reference) >= 100 else f"{value:{sign}.1f}"
    if kind == "count":
        return f"{value:.0f}"
    return f"{value:{sign}.3f}"


def _cell(metrics: Mapping[str, float], name: str, kind: str, signed: bool) -> str:
    value = format_value(metrics.get(name), kind, signed)
    if f"{name}_ci_low" not in metrics:
        return value
    low, high = (format_value(metrics[f"{name}_ci{s}"], kind, signed, like=metrics.get(name))
                 for s in ("_low", "_high"))
    return f"{value} [{low}, {high}]"


def summary_rows(env: type[Env] | str, results: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the summary: one row per metric, one column per policy or difference (`_minus_`)."""
    columns = list(results)
    header = ["metric", *columns]
    rows = []
    for name, (label, kind) in metric_rows(env).items():
        if not any(name in results[c] for c in columns):
            continue
        rows.append([label, *(_cell(results[c], name, kind, signed="_minus_" in c and name != "n")
                              if name in results[c] else "" for c in columns)])
    return header, rows


def markdown_table(env: type[Env] | str, results: Mapping[str, Mapping[str, float]], confidence: float = 0.95) -> str:
    """The summary as a markdown table (value [95% interval] per cell)."""
    header, rows = summary_rows(env, results)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    note = (f"\nValues with [{100 * confidence:.0f}% percentile bootstrap interval]; `a_minus_b` columns are "
            "paired differences on the same test samples.\n")
    return "\n".join(lines) + "\n" + note


Sections = Mapping[str, Mapping[str, Any]]  # extra sections: heading -> {figure: value}, shown after the summary


def _figure_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.0f}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def sections_markdown(sections: Sections | None) -> str:
    """Extra sections as markdown: a heading and a two-column table each."""
    parts = []
    for heading, figures in (sections or {}).items():
        lines = [f"## {heading}", "", "| figure | value |", "|---|---|"]
        lines += [f"| {name} | {_figure_text(value)} |" for name, value in figures.items()]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


Tables = Mapping[str, Mapping[str, Mapping[str, float]]]  # more summary tables: heading -> results columns


def tables_markdown(env: type[Env] | str, tables: Tables | None, confidence: float = 0.95) -> str:
    """More summary tables (e.g. in and out of distribution side by side), each under its heading."""
    return "\n".join(f"## {heading}\n\n{markdown_table(env, columns, confidence)}"
                     for heading, columns in (tables or {}).items())


def write_markdown(path: str | Path, env: type[Env] | str, results: Mapping[str, Mapping[str, float]],
                   title: str = "Evaluation", confidence: float = 0.95, sections: Sections | None = None,
                   tables: Tables | None = None) -> None:
    """Write reports/eval.md: a title, the summary table, any more tables and any extra sections."""
    extra = "\n".join(part for part in (tables_markdown(env, tables, confidence), sections_markdown(sections)) if part)
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(f"# {title}\n\n{markdown_table(env, results, confidence)}" + (f"\n{extra}" if extra else ""))


def thumbnail_data_uri(image: Image.Image, max_px: int = THUMBNAIL_PX, quality: int = 80) -> str:
    """A JPEG thumbnail of `image` as a data URI."""
    thumb = image.convert("RGB")
    thumb.thumbnail((max_px, max_px))
    buffer = io.BytesIO()
    thumb.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin:0.5rem 0 1.5rem}
td,th{border:1px solid #ccc;padding:0.25rem 0.6rem;text-align:right}
td:first-child,th:first-child{text-align:left}
.map{width:100%;max-width:1000px;border:1px solid #ccc;display:block;margin-bottom:0.3rem}
.grid{stroke:#dde3ea;stroke-width:0.2}
.base{stroke:#b8c0cc;stroke-width:0.5;stroke-linecap:round}
.link{stroke-width:0.25;opacity:0.6}
.truth{fill:#111}
.pred{opacity:0.85}
.figure{max-width:100%}
.gallery{display:flex;flex-wrap:wrap;gap:0.8rem;align-items:flex-start}
.card{border:1px solid #ccc;padding:0.5rem;width:260px;font-size:0.8rem}
.card img{max-width:100%;display:block;margin-bottom:0.3rem}
.card pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;margin:0.2rem 0;padding:0.2rem;
 max-height:7.5em;overflow:auto}
.note{color:#666}
.ok{color:#2ca02c}.bad{color:#d62728}
"""


def shown_ids(records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], max_samples: int | None) -> set[str]:
    """The sample ids the page draws: all, or `max_samples` evenly spaced over the sorted ids."""
    ids = sorted({str(r["id"]) for records in records_by_policy.values() for r in records})
    if max_samples is None or len(ids) <= max_samples:
        return set(ids)
    return {ids[i] for i in (np.arange(max(max_samples, 0)) * len(ids)) // max(max_samples, 1)}


def answer_note(answer: str) -> str:
    """A line under a gallery answer that the box alone would misrepresent: blank, or cut (empty otherwise)."""
    if not answer.strip():
        # a run of newlines draws as an empty box: say what is in it
        return f'<div class="note">{len(answer)} characters, whitespace only</div>' if answer else (
            '<div class="note">empty answer</div>')
    if len(answer) > ANSWER_CHARS:
        return f'<div class="note">first {ANSWER_CHARS} of {len(answer)} characters</div>'
    return ""


def _gallery(env: type, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
             images: Mapping[str, Sequence[Image.Image]]) -> str:
    by_policy = {p: {str(r["id"]): r for r in recs} for p, recs in records_by_policy.items()}
    ids = sorted({sample_id for recs in by_policy.values() for sample_id in recs})
    cards = []
    for sample_id in ids:
        card = [f'<div class="card" id="sample-{html.escape(sample_id)}">']
        records = {policy: recs.get(sample_id) for policy, recs in by_policy.items()}
        for image in env.gallery_images(images.get(sample_id, ()), records):
            card.append(f'<img src="{thumbnail_data_uri(image)}" alt="sample {html.escape(sample_id)}">')
        any_record = next(recs[sample_id] for recs in by_policy.values() if sample_id in recs)
        card.append(f"<div><b>id</b> {html.escape(sample_id)}</div>")
        card.append(f"<div><b>truth</b> {html.escape(env.truth_text(any_record['truth']))}</div>")
        for policy, recs in by_policy.items():
            record = recs.get(sample_id)
            if record is None:
                continue
            answer = str(record.get("answer", ""))
            note = answer_note(answer)
            answer = answer if len(answer) <= ANSWER_CHARS else answer[:ANSWER_CHARS] + " ..."
            outcome = env.outcome_text(record)
            status = "ok" if format_valid(env, record) else "bad"
            turns = episode_html(record, next(iter(images.get(sample_id, ())), None), thumbnail_data_uri)
            card.append(f'<div><b>{html.escape(policy)}</b>: {html.escape(outcome)}, '
                        f'reward {float(record["reward"]):.3f} '
                        f'<span class="{status}">format {"ok" if status == "ok" else "invalid"}</span>'
                        f"<pre>{html.escape(answer)}</pre>{note}{turns}</div>")
        card.append("</div>")
        cards.append("".join(card))
    return '<div class="gallery">' + "".join(cards) + "</div>"


def render_html(env: type[Env] | str, results: Mapping[str, Mapping[str, float]],
                records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                images: Mapping[str, Sequence[Image.Image]], *, env_params: EnvParams | None = None,
                title: str = "vlmgym evaluation", confidence: float = 0.95, max_samples: int | None = None,
                sections: Sections | None = None, figures: Mapping[str, str | Path] | None = None,
                figure_notes: Mapping[str, str] | None = None, tables: Tables | None = None) -> str:
    """The whole self-contained page as a string; maps and gallery show at most `max_samples` samples (None: all).

    `sections` adds two-column tables after the summary; `figures` ({caption: PNG path}) embeds images, each
    with its paragraph from `figure_notes` ({caption: text}) when there is one; the env
    (an Env class or name) adds its own part before the gallery (Env.report_html, with its params `env_params`).
    """
    env = env_class(env)
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>Environment <b>{html.escape(env.name)}</b>. Each cell: value [{100 * confidence:.0f}% percentile "
            "bootstrap interval]; <code>a_minus_b</code> columns are paired differences on the same samples.</p>",
            _html_table(env, results)]
    for heading, columns in (tables or {}).items():
        body.append(f"<h2>{html.escape(heading)}</h2>{_html_table(env, columns)}")
    for heading, values in (sections or {}).items():
        rows_html = "".join(f"<tr><td>{html.escape(str(name))}</td><td>{html.escape(_figure_text(value))}</td></tr>"
                            for name, value in values.items())
        body.append(f"<h2>{html.escape(heading)}</h2><table><tr><th>figure</th><th>value</th></tr>{rows_html}</table>")
    for caption, png in (figures or {}).items():
        encoded = base64.b64encode(Path(png).read_bytes()).decode("ascii")
        note = (figure_notes or {}).get(caption)
        body.append(f"<h2>{html.escape(caption)}</h2>" + (f"<p>{html.escape(note)}</p>" if note else "")
                    + f"<img class=\"figure\" alt=\"{html.escape(caption)}\" src=\"data:image/png;base64,{encoded}\">")
    shown = shown_ids(records_by_policy, max_samples)
    total = len({str(r["id"]) for records in records_by_policy.values() for r in records})
    if len(shown) < total:
        body.append(f"<p>Maps and gallery show {len(shown)} of the {total} test samples (evenly spaced by id); "
                    "the table covers all of them.</p>")
    records_by_policy = {p: [r for r in recs if str(r["id"]) in shown] for p, recs in records_by_policy.items()}
    body.append(env.report_html(records_by_policy, env_params))
    body.append("<h2>Test samples</h2>")
    body.append(_gallery(env, records_by_policy, images))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def _html_table(env: type[Env] | str, results: Mapping[str, Mapping[str, float]]) -> str:
    header, rows = summary_rows(env, results)
    table = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    table += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    return "".join(table) + "</table>"


def write_html(path: str | Path, env: type[Env] | str, results: Mapping[str, Mapping[str, float]],
               records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
               images: Mapping[str, Sequence[Image.Image]], *, env_params: EnvParams | None = None,
               title: str = "vlmgym evaluation", confidence: float = 0.95, max_samples: int | None = None,
               sections: Sections | None = None, figures: Mapping[str, str | Path] | None = None,
               figure_notes: Mapping[str, str] | None = None, tables: Tables | None = None) -> None:
    """Write reports/eval.html atomically (see render_html)."""
    page = render_html(env, results, records_by_policy, images, env_params=env_params, title=title,
                       confidence=confidence, max_samples=max_samples, sections=sections, figures=figures,
                       figure_notes=figure_notes, tables=tables)
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(page, encoding="utf-8")
