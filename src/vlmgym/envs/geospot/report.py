"""geospot's part of the evaluation report: the distance CDF (CSV for `dvc plots`, PNG) and the world maps of
predictions (inline SVG in reports/eval.html)."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.envs.geospot.metrics import MISSING_DISTANCE_KM, RADII_KM, predicted_point, sample_distances_km, true_point
from vlmgym.stats.plots import POLICY_COLOURS, save_figure, write_csv


def cdf_grid_km(points: int = 120) -> np.ndarray:
    """Log-spaced distances from 0.1 km to the largest possible one, plus the OSV-5M radii (sorted, unique)."""
    grid = np.geomspace(0.1, math.ceil(MISSING_DISTANCE_KM), points)
    return np.unique(np.concatenate([grid, np.asarray(RADII_KM, dtype=np.float64)]))


def distance_cdf(distances_km: Mapping[str, Sequence[float]], grid_km: np.ndarray | None = None) -> list[dict]:
    """Rows {distance_km, <policy>: share of samples within that distance} on a shared grid."""
    grid = cdf_grid_km() if grid_km is None else np.asarray(grid_km, dtype=np.float64)
    columns = {}
    for policy, values in distances_km.items():
        values = np.sort(np.asarray(values, dtype=np.float64))
        if values.size == 0:
            raise ValueError(f"distance CDF: policy {policy!r} has no distances")
        columns[policy] = np.searchsorted(values, grid, side="right") / values.size
    return [{"distance_km": round(float(x), 4), **{p: round(float(c[i]), 6) for p, c in columns.items()}}
            for i, x in enumerate(grid)]


def write_distance_cdf_csv(path: str | Path, distances_km: Mapping[str, Sequence[float]]) -> list[dict]:
    """Write the distance CDF (columns distance_km, then one per policy) for `dvc plots`; returns the rows."""
    rows = distance_cdf(distances_km)
    write_csv(path, ["distance_km", *distances_km], rows)
    return rows


def plot_distance_cdf_png(path: str | Path, distances_km: Mapping[str, Sequence[float]]) -> None:
    """The distance CDF per policy as a PNG (log distance axis, OSV-5M radii marked)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the pipeline machines
    import matplotlib.pyplot as plt

    rows = distance_cdf(distances_km)
    grid = [row["distance_km"] for row in rows]
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    try:
        for i, policy in enumerate(distances_km):
            axis.plot(grid, [row[policy] for row in rows], label=policy, color=POLICY_COLOURS[i % len(POLICY_COLOURS)])
        for radius in RADII_KM:
            axis.axvline(radius, color="0.85", linewidth=0.8, zorder=0)
        axis.set(xscale="log", xlabel="distance to truth (km)", ylabel="share of test samples within",
                 ylim=(0, 1), title="Distance CDF")
        axis.legend()
        save_figure(figure, path)
    finally:
        plt.close(figure)


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


def map_section_html(records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], map_base_points: int) -> str:
    """One world map per policy (truth -> prediction), for the page's geospot section."""
    basemap = basemap_points(map_base_points) if map_base_points > 0 else None
    parts = ["<h2>Predictions on the map</h2><p>Black: truth; coloured: the policy's prediction, joined to "
             "its truth. Grey dots: gazetteer places. Answers without coordinates are not drawn.</p>"]
    for i, (policy, records) in enumerate(records_by_policy.items()):
        colour = POLICY_COLOURS[i % len(POLICY_COLOURS)]
        parts.append(f"<h3 style=\"color:{colour}\">{html.escape(policy)}</h3>")
        parts.append(world_map_svg(policy, records, basemap, colour))
    return "".join(parts)


def write_distance_cdf(out_root: Path, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]]
                       ) -> tuple[dict[str, Path], dict[str, Path]]:
    """metrics/plots/distance_cdf.csv and reports/distance_cdf.png under out_root: (files by role, figures)."""
    distances = {policy: sample_distances_km(records) for policy, records in records_by_policy.items()}
    files = {"distance_cdf": Path(out_root) / "metrics" / "plots" / "distance_cdf.csv",
             "distance_cdf_png": Path(out_root) / "reports" / "distance_cdf.png"}
    write_distance_cdf_csv(files["distance_cdf"], distances)
    plot_distance_cdf_png(files["distance_cdf_png"], distances)
    return files, {"Distance CDF": files["distance_cdf_png"]}
