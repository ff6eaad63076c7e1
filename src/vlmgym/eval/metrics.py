"""Geolocation and nlvr2 metrics over rollout records, as the OSV-5M evaluation code computes them.

A rollout record is one answer of one policy to one test sample (a JSON object, one per
line of the rollout JSONL; vlmgym.eval.records.rollout_record builds one from an env step):

    id                 sample id (string)
    answer             the model's answer text
    parsed             the fields the env's parser read from it (free-form, for reports)
    pred_lat, pred_lon predicted coordinates in degrees, or null          (geospot)
    distance_km        haversine to the truth, for readers of the JSONL   (geospot; recomputed here)
    pred_label         predicted truth value, or null                      (nlvr2)
    truth              geospot: latitude, longitude, country, region, sub_region, city
                       nlvr2: label (bool), sentence
    reward             the env's scalar reward
    reward_components  the env's named reward components (free-form)
    format_ok          whether the env's parser found a well-formed answer (a JSON boolean)

Geospot metrics follow the osv5m project's `metrics/` code: haversine distance with
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
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from vlmgym.eval.bootstrap import Interval, Statistic, bootstrap_intervals, paired_bootstrap_intervals
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


def _field(record: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a rollout record must be a JSON object, got {type(record).__name__}")
    if key not in record:
        raise ValueError(f"{where}: rollout record has no {key!r} field")
    return record[key]


def _where(record: Any, index: int) -> str:
    sample_id = record.get("id") if isinstance(record, Mapping) else None
    return f"record {index} (id {sample_id!r})"


def _reward(record: Mapping[str, Any], where: str) -> float:
    value = _field(record, "reward", where)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{where}: reward must be a finite number, got {value!r}")
    return float(value)


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


def format_valid(env: str, record: Mapping[str, Any]) -> bool:
    """The env's format_ok and a usable prediction (coordinates for geospot, a true/false for nlvr2)."""
    usable = predicted_point(record) is not None if env == "geospot" else isinstance(record.get("pred_label"), bool)
    flag = record.get("format_ok")
    return isinstance(flag, bool | np.bool_) and bool(flag) and usable  # a stray "yes" string is not a flag


def predicted_point(record: Mapping[str, Any]) -> tuple[float, float] | None:
    """The record's predicted (lat, lon), or None when either is missing or unusable."""
    lat, lon = coordinate(record.get("pred_lat"), 90), coordinate(record.get("pred_lon"), 180)
    return None if lat is None or lon is None else (lat, lon)


def true_point(record: Mapping[str, Any], where: str = "record") -> tuple[float, float]:
    """The record's true (lat, lon); a clear error when the truth is missing or malformed."""
    truth = _field(record, "truth", where)
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
    truths = [true_point(r, _where(r, i)) for i, r in enumerate(records)]  # validates each record first
    pairs = [(i, p, t) for i, (p, t) in enumerate(zip(map(predicted_point, records), truths)) if p is not None]
    if pairs:
        rows, pred, truth = zip(*pairs)
        pred, truth = np.asarray(pred), np.asarray(truth)
        distance[list(rows)] = haversine_km(pred[:, 0], pred[:, 1], truth[:, 0], truth[:, 1])
    return distance


def geospot_statistics(records: Sequence[Mapping[str, Any]],
                       reverse_geocoder: ReverseGeocoder | None = None) -> dict[str, Statistic]:
    """Per-sample arrays of every geospot metric, ready for point estimates and bootstrap intervals."""
    if not records:
        raise ValueError("no geospot records to evaluate")
    distance = sample_distances_km(records)  # also validates every truth
    predicted = [predicted_point(r) for r in records]
    format_ok = np.array([format_valid("geospot", r) for r in records])
    rewards = np.array([_reward(r, _where(r, i)) for i, r in enumerate(records)])
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
    stats["format_valid_rate"] = Statistic("mean", format_ok.astype(np.float64))
    stats["mean_reward"] = Statistic("mean", rewards)
    return stats


def nlvr2_statistics(records: Sequence[Mapping[str, Any]]) -> dict[str, Statistic]:
    """Per-sample arrays of the nlvr2 metrics: accuracy, format-valid rate, mean reward."""
    if not records:
        raise ValueError("no nlvr2 records to evaluate")
    correct, format_ok, rewards = [], [], []
    for i, record in enumerate(records):
        where = _where(record, i)
        truth = _field(record, "truth", where)
        label = truth.get("label") if isinstance(truth, Mapping) else None
        if not isinstance(label, bool):
            raise ValueError(f"{where}: truth.label must be true or false, got {label!r}")
        predicted = record.get("pred_label")
        predicted = predicted if isinstance(predicted, bool) else None  # garbage is no answer, never a side
        correct.append(predicted is label)
        format_ok.append(format_valid("nlvr2", record))
        rewards.append(_reward(record, where))
    return {
        "accuracy": Statistic("mean", np.asarray(correct, np.float64)),
        "format_valid_rate": Statistic("mean", np.asarray(format_ok, np.float64)),
        "mean_reward": Statistic("mean", np.asarray(rewards, np.float64)),
    }


def statistics_for(env: str, records: Sequence[Mapping[str, Any]],
                   reverse_geocoder: ReverseGeocoder | None = None) -> dict[str, Statistic]:
    """The metric arrays of environment `env` ("geospot" or "nlvr2")."""
    if env == "geospot":
        return geospot_statistics(records, reverse_geocoder)
    if env == "nlvr2":
        return nlvr2_statistics(records)
    raise ValueError(f"no metrics for environment {env!r} (known: geospot, nlvr2)")


def flatten_intervals(intervals: Mapping[str, Interval]) -> dict[str, float]:
    """{name: Interval} -> flat {name, name_ci_low, name_ci_high}."""
    flat: dict[str, float] = {}
    for name, interval in intervals.items():
        flat[name] = interval.estimate
        flat[f"{name}_ci_low"] = interval.low
        flat[f"{name}_ci_high"] = interval.high
    return flat


def evaluate(env: str, records: Sequence[Mapping[str, Any]], *, n_resamples: int = 1000, seed: int = 0,
             confidence: float = 0.95, reverse_geocoder: ReverseGeocoder | None = None) -> dict[str, float]:
    """Flat metrics of one policy's records, each with its bootstrap interval, plus `n` (samples)."""
    intervals = bootstrap_intervals(statistics_for(env, records, reverse_geocoder), n_resamples=n_resamples,
                                    seed=seed, confidence=confidence)
    return {"n": float(len(records)), **flatten_intervals(intervals)}


def align_by_id(treatment: Sequence[Mapping[str, Any]],
                control: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Order both policies' records by sample id; they must cover exactly the same ids, once each."""
    by_id = []
    for name, records in (("treatment", treatment), ("control", control)):
        index: dict[str, Mapping[str, Any]] = {}
        for i, record in enumerate(records):
            sample_id = str(_field(record, "id", _where(record, i)))
            if sample_id in index:
                raise ValueError(f"{name} records: sample id {sample_id!r} appears twice (record {i})")
            index[sample_id] = record
        by_id.append(index)
    only_t, only_c = sorted(by_id[0].keys() - by_id[1].keys()), sorted(by_id[1].keys() - by_id[0].keys())
    if only_t or only_c:
        raise ValueError(f"a paired comparison needs the same samples: {len(only_t)} ids only in treatment "
                         f"{only_t[:5]}, {len(only_c)} only in control {only_c[:5]}")
    ids = sorted(by_id[0])
    return [by_id[0][i] for i in ids], [by_id[1][i] for i in ids]


def compare(env: str, treatment: Sequence[Mapping[str, Any]], control: Sequence[Mapping[str, Any]], *,
            n_resamples: int = 1000, seed: int = 0, confidence: float = 0.95,
            reverse_geocoder: ReverseGeocoder | None = None) -> dict[str, float]:
    """Flat treatment - control differences on the same samples, with paired bootstrap intervals."""
    treatment, control = align_by_id(treatment, control)
    intervals = paired_bootstrap_intervals(statistics_for(env, treatment, reverse_geocoder),
                                           statistics_for(env, control, reverse_geocoder),
                                           n_resamples=n_resamples, seed=seed, confidence=confidence)
    return {"n": float(len(treatment)), **flatten_intervals(intervals)}


def evaluate_policies(env: str, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], *,
                      comparisons: Sequence[tuple[str, str]] = (("grpo", "sft"),), n_resamples: int = 1000,
                      seed: int = 0, confidence: float = 0.95,
                      reverse_geocoder: ReverseGeocoder | None = None) -> dict[str, dict[str, float]]:
    """{policy: flat metrics} plus {"<a>_minus_<b>": flat paired differences} for each comparison present."""
    out = {policy: evaluate(env, records, n_resamples=n_resamples, seed=seed, confidence=confidence,
                            reverse_geocoder=reverse_geocoder)
           for policy, records in records_by_policy.items()}
    for treatment, control in comparisons:
        if treatment in records_by_policy and control in records_by_policy:
            out[f"{treatment}_minus_{control}"] = compare(
                env, records_by_policy[treatment], records_by_policy[control], n_resamples=n_resamples,
                seed=seed, confidence=confidence, reverse_geocoder=reverse_geocoder)
    return out
