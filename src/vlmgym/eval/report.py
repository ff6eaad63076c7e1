"""The evaluation report: a markdown summary table and a self-contained HTML page (table, world map, gallery).

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

from vlmgym.data.layout import atomic_file
from vlmgym.eval.metrics import format_valid, predicted_point, sample_distances_km, true_point
from vlmgym.eval.plots import POLICY_COLOURS

THUMBNAIL_PX = 192
ANSWER_CHARS = 400  # longer answers are cut in the gallery (the rollout JSONL keeps them whole)

# name -> (label, unit kind); the order of rows in both tables. Metrics a dict lacks are skipped.
METRIC_ROWS = {
    "n": ("samples", "count"),
    "geoscore": ("GeoScore", "score"),
    "mean_km": ("mean distance (km)", "km"),
    "median_km": ("median distance (km)", "km"),
    "acc_1km": ("within 1 km", "rate"),
    "acc_25km": ("within 25 km", "rate"),
    "acc_200km": ("within 200 km", "rate"),
    "acc_750km": ("within 750 km", "rate"),
    "acc_2500km": ("within 2500 km", "rate"),
    "acc_country": ("country", "rate"),
    "acc_region": ("region", "rate"),
    "acc_sub_region": ("sub-region", "rate"),
    "acc_city": ("city", "rate"),
    "accuracy": ("accuracy", "rate"),
    "format_valid_rate": ("format valid", "rate"),
    "mean_reward": ("mean reward", "reward"),
}


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


def summary_rows(results: Mapping[str, Mapping[str, float]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the summary: one row per metric, one column per policy or difference (`_minus_`)."""
    columns = list(results)
    header = ["metric", *columns]
    rows = []
    for name, (label, kind) in METRIC_ROWS.items():
        if not any(name in results[c] for c in columns):
            continue
        rows.append([label, *(_cell(results[c], name, kind, signed="_minus_" in c and name != "n")
                              if name in results[c] else "" for c in columns)])
    return header, rows


def markdown_table(results: Mapping[str, Mapping[str, float]], confidence: float = 0.95) -> str:
    """The summary as a markdown table (value [95% interval] per cell)."""
    header, rows = summary_rows(results)
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


def write_markdown(path: str | Path, results: Mapping[str, Mapping[str, float]], title: str = "Evaluation",
                   confidence: float = 0.95, sections: Sections | None = None) -> None:
    """Write reports/eval.md: a title, the summary table and any extra sections."""
    extra = sections_markdown(sections)
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(f"# {title}\n\n{markdown_table(results, confidence)}" + (f"\n{extra}" if extra else ""))


def thumbnail_data_uri(image: Image.Image, max_px: int = THUMBNAIL_PX, quality: int = 80) -> str:
    """A JPEG thumbnail of `image` as a data URI."""
    thumb = image.convert("RGB")
    thumb.thumbnail((max_px, max_px))
    buffer = io.BytesIO()
    thumb.save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def basemap_points(max_points: int = 4000, seed: int = 0) -> np.ndarray:
    """(lat, lon) rows of a seeded subsample of the gazetteer's places, for the map's faint base layer."""
    from vlmgym.geo import gazetteer

    places = gazetteer()
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(places), size=min(max_points, len(places)), replace=False))
    return np.stack([places.lat[chosen], places.lon[chosen]], axis=1)


def _xy(lat: float, lon: float) -> tuple[float, float]:
    return round(lon + 180.0, 3), round(90.0 - lat, 3)  # equirectangular, 1 unit per degree


def map_segments(lat1: float, lon1: float, lat2: float, lon2: float) -> list[tuple[float, float, float, float]]:
    """Truth -> prediction as one segment, or two meeting at the map's edge when the short way crosses +-180."""
    if abs(lon2 - lon1) <= 180:
        return [(lat1, lon1, lat2, lon2)]
    shifted = lon2 - 360 if lon2 > lon1 else lon2 + 360  # the copy of the prediction on the near side
    edge = 180.0 if shifted > lon1 else -180.0
    lat_edge = lat1 + (lat2 - lat1) * (edge - lon1) / (shifted - lon1)
    return [(lat1, lon1, lat_edge, edge), (lat_edge, -edge, lat2, lon2)]


def world_map_svg(policy: str, records: Sequence[Mapping[str, Any]], basemap: np.ndarray | None,
                  colour: str) -> str:
    """Inline SVG (no namespace URL needed inside HTML): base places, truths, predictions, truth -> prediction."""
    parts = [f'<svg viewBox="0 0 360 180" class="map" role="img" aria-label="{html.escape(policy)} predictions">',
             '<rect width="360" height="180" fill="#f4f7fb"/>']
    for lon in range(-180, 181, 30):
        parts.append(f'<line x1="{lon + 180}" y1="0" x2="{lon + 180}" y2="180" class="grid"/>')
    for lat in range(-90, 91, 30):
        parts.append(f'<line x1="0" y1="{90 - lat}" x2="360" y2="{90 - lat}" class="grid"/>')
    if basemap is not None and len(basemap):
        dots = "".join(f"M{x} {y}h0" for x, y in (_xy(float(a), float(b)) for a, b in basemap))
        parts.append(f'<path d="{dots}" class="base"/>')
    for record in records:
        truth = true_point(record)
        predicted = predicted_point(record)
        tx, ty = _xy(*truth)
        if predicted is not None:
            for a_lat, a_lon, b_lat, b_lon in map_segments(*truth, *predicted):
                (x1, y1), (x2, y2) = _xy(a_lat, a_lon), _xy(b_lat, b_lon)
                parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" class="link"/>')
            px, py = _xy(*predicted)
            parts.append(f'<circle cx="{px}" cy="{py}" r="0.9" fill="{colour}" class="pred"/>')
        parts.append(f'<circle cx="{tx}" cy="{ty}" r="0.9" class="truth"/>')
    parts.append("</svg>")
    return "".join(parts)


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
.gallery{display:flex;flex-wrap:wrap;gap:0.8rem}
.card{border:1px solid #ccc;padding:0.5rem;width:260px;font-size:0.8rem}
.card img{max-width:100%;display:block;margin-bottom:0.3rem}
.card pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;margin:0.2rem 0;padding:0.2rem}
.ok{color:#2ca02c}.bad{color:#d62728}
"""


def _truth_text(env: str, truth: Mapping[str, Any]) -> str:
    if env == "nlvr2":
        sentence = truth.get("sentence")
        prefix = f"{sentence} -> " if sentence else ""
        return f"{prefix}{truth.get('label')}"
    names = ", ".join(str(truth[k]) for k in ("city", "region", "country") if truth.get(k))
    return f"{names} ({float(truth['latitude']):.3f}, {float(truth['longitude']):.3f})"


def shown_ids(records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], max_samples: int | None) -> set[str]:
    """The sample ids the page draws: all, or `max_samples` evenly spaced over the sorted ids."""
    ids = sorted({str(r["id"]) for records in records_by_policy.values() for r in records})
    if max_samples is None or len(ids) <= max_samples:
        return set(ids)
    return {ids[i] for i in (np.arange(max(max_samples, 0)) * len(ids)) // max(max_samples, 1)}


def _gallery(env: str, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
             images: Mapping[str, Sequence[Image.Image]], distances: Mapping[str, dict[str, float]]) -> str:
    by_policy = {p: {str(r["id"]): r for r in recs} for p, recs in records_by_policy.items()}
    ids = sorted({sample_id for recs in by_policy.values() for sample_id in recs})
    cards = []
    for sample_id in ids:
        card = [f'<div class="card" id="sample-{html.escape(sample_id)}">']
        for image in images.get(sample_id, ()):
            card.append(f'<img src="{thumbnail_data_uri(image)}" alt="sample {html.escape(sample_id)}">')
        any_record = next(recs[sample_id] for recs in by_policy.values() if sample_id in recs)
        card.append(f"<div><b>id</b> {html.escape(sample_id)}</div>")
        card.append(f"<div><b>truth</b> {html.escape(_truth_text(env, any_record['truth']))}</div>")
        for policy, recs in by_policy.items():
            record = recs.get(sample_id)
            if record is None:
                continue
            answer = str(record.get("answer", ""))
            answer = answer if len(answer) <= ANSWER_CHARS else answer[:ANSWER_CHARS] + " ..."
            if env == "geospot":
                outcome = f"{distances[policy][sample_id]:.0f} km"
            else:
                correct = record.get("pred_label") is record["truth"].get("label")
                outcome = "correct" if correct else "wrong"
            status = "ok" if format_valid(env, record) else "bad"
            card.append(f'<div><b>{html.escape(policy)}</b>: {outcome}, reward {float(record["reward"]):.3f} '
                        f'<span class="{status}">format {"ok" if status == "ok" else "invalid"}</span>'
                        f"<pre>{html.escape(answer)}</pre></div>")
        card.append("</div>")
        cards.append("".join(card))
    return '<div class="gallery">' + "".join(cards) + "</div>"


def render_html(env: str, results: Mapping[str, Mapping[str, float]],
                records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                images: Mapping[str, Sequence[Image.Image]], *, basemap: np.ndarray | None = None,
                title: str = "vlmgym evaluation", confidence: float = 0.95, max_samples: int | None = None,
                sections: Sections | None = None, figures: Mapping[str, str | Path] | None = None) -> str:
    """The whole self-contained page as a string; maps and gallery show at most `max_samples` samples (None: all).

    `sections` adds two-column tables after the summary; `figures` ({caption: PNG path}) embeds images.
    """
    header, rows = summary_rows(results)
    table = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    table += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
    table.append("</table>")
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p>Environment <b>{html.escape(env)}</b>. Each cell: value [{100 * confidence:.0f}% percentile "
            "bootstrap interval]; <code>a_minus_b</code> columns are paired differences on the same samples.</p>",
            "".join(table)]
    for heading, values in (sections or {}).items():
        rows_html = "".join(f"<tr><td>{html.escape(str(name))}</td><td>{html.escape(_figure_text(value))}</td></tr>"
                            for name, value in values.items())
        body.append(f"<h2>{html.escape(heading)}</h2><table><tr><th>figure</th><th>value</th></tr>{rows_html}</table>")
    for caption, png in (figures or {}).items():
        encoded = base64.b64encode(Path(png).read_bytes()).decode("ascii")
        body.append(f"<h2>{html.escape(caption)}</h2><img alt=\"{html.escape(caption)}\" "
                    f"src=\"data:image/png;base64,{encoded}\">")
    shown = shown_ids(records_by_policy, max_samples)
    total = len({str(r["id"]) for records in records_by_policy.values() for r in records})
    if len(shown) < total:
        body.append(f"<p>Maps and gallery show {len(shown)} of the {total} test samples (evenly spaced by id); "
                    "the table covers all of them.</p>")
    records_by_policy = {p: [r for r in recs if str(r["id"]) in shown] for p, recs in records_by_policy.items()}
    distances = {}
    if env == "geospot":
        body.append("<h2>Predictions on the map</h2><p>Black: truth; coloured: the policy's prediction, joined to "
                    "its truth. Grey dots: gazetteer places. Answers without coordinates are not drawn.</p>")
        for i, (policy, records) in enumerate(records_by_policy.items()):
            colour = POLICY_COLOURS[i % len(POLICY_COLOURS)]
            body.append(f"<h3 style=\"color:{colour}\">{html.escape(policy)}</h3>")
            body.append(world_map_svg(policy, records, basemap, colour))
            distances[policy] = dict(zip((str(r["id"]) for r in records), sample_distances_km(records).tolist()))
    body.append("<h2>Test samples</h2>")
    body.append(_gallery(env, records_by_policy, images, distances))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")


def write_html(path: str | Path, env: str, results: Mapping[str, Mapping[str, float]],
               records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
               images: Mapping[str, Sequence[Image.Image]], *, basemap: np.ndarray | None = None,
               title: str = "vlmgym evaluation", confidence: float = 0.95, max_samples: int | None = None,
               sections: Sections | None = None, figures: Mapping[str, str | Path] | None = None) -> None:
    """Write reports/eval.html atomically (see render_html)."""
    page = render_html(env, results, records_by_policy, images, basemap=basemap, title=title, confidence=confidence,
                       max_samples=max_samples, sections=sections, figures=figures)
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(page, encoding="utf-8")
