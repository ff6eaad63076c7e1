"""The geospot reward: an offline, hierarchical, geodesic score of a parsed answer against a sample's truth.

Each level -- country, region, city, coordinates -- scores k = exp(-d / tau), d the WGS84 geodesic distance in
km between the predicted and the true place. Names resolve through the gazetteer: a country or a region to its
representative place, a city to its best-matching place; the truth's labels resolve the same way, so naming the
right area gives d = 0. The levels combine as a weighted mean over ALL levels the truth has: a missing or
unresolvable predicted field scores 0 and keeps its weight, so answering only the country never beats a full,
correct answer. The weights follow a curriculum on training progress, interpolated linearly between stages;
tau can tighten geometrically with progress. An optional format share rewards the five-line layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vlmgym.envs.geospot.parse import ParsedAnswer
from vlmgym.envs.geospot.settings import GeospotParams
from vlmgym.geo.distance import geodesic_km
from vlmgym.geo.gazetteer import Gazetteer, Place

LEVELS = ("country", "region", "city", "coords")
_INFO_KEYS = tuple((f"k_{lv}", f"d_{lv}_km", f"w_{lv}", f"tau_{lv}_km") for lv in LEVELS)


@dataclass(frozen=True)
class GeospotTruth:
    """A sample's truth, resolved once per reset: coordinates and each level's true place."""

    latitude: float
    longitude: float
    country: Place | None
    region: Place | None
    city: Place | None
    unresolved: tuple[str, ...] = ()  # labels the gazetteer does not know (those levels are not scored)


def resolve_truth(meta: dict, gazetteer: Gazetteer) -> GeospotTruth:
    """Resolve a sample's labels (country code, region, city) and coordinates; bad coordinates raise ValueError."""
    sample_id = meta.get("id", "?")
    coords = []
    for key in ("latitude", "longitude"):
        try:
            value = float(meta[key])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"geospot sample {sample_id}: {key} {meta.get(key)!r} is not a number") from err
        coords.append(value)
    lat, lon = coords
    if not (math.isfinite(lat) and math.isfinite(lon) and abs(lat) <= 90 and abs(lon) <= 180):
        raise ValueError(f"geospot sample {sample_id}: coordinates ({lat}, {lon}) are out of range")
    labels = {k: _label(meta.get(k)) for k in ("country", "region", "city")}
    unresolved = []
    cc = gazetteer.resolve_country(labels["country"]) if labels["country"] else None
    country = gazetteer.country_point(cc) if cc else None
    region = admin1 = None
    if cc and labels["region"]:
        admin1 = labels["region"] if (cc, labels["region"]) in gazetteer.region_places else None
        if admin1 is None:
            found = gazetteer.resolve_region(labels["region"], cc)
            admin1 = found[1] if found and found[0] == cc else None
        region = gazetteer.region_point(cc, admin1) if admin1 is not None else None
    # the labelled city is the nearest place of that name to the true coordinates: exactly the labelled row
    city = gazetteer.resolve_city(labels["city"], cc, admin1, near=(lat, lon)) if labels["city"] else None
    for level, place in (("country", country), ("region", region), ("city", city)):
        if place is None:
            unresolved.append(f"{level}: {labels[level]!r}")
    return GeospotTruth(lat, lon, country, region, city, tuple(unresolved))


def _label(value) -> str:
    # only "" means no label: "Nan" (Thailand) and "None" (Piedmont) are real places
    return "" if value is None else str(value).strip()


def resolve_prediction(parsed: ParsedAnswer, gazetteer: Gazetteer) -> tuple[dict[str, Place | None], list[str]]:
    """Places the answer names (None where missing or unknown) and the names that did not resolve."""
    near = parsed.coordinates
    unresolved = []
    cc = gazetteer.resolve_country(parsed.country) if parsed.country else None
    if parsed.country and cc is None:
        unresolved.append(f"country: {parsed.country!r}")
    region_key = gazetteer.resolve_region(parsed.region, cc, near) if parsed.region else None
    if parsed.region and region_key is None:
        unresolved.append(f"region: {parsed.region!r}")
    city_cc = cc or (region_key[0] if region_key else None)
    city_admin1 = region_key[1] if region_key and region_key[0] == city_cc else None
    city = gazetteer.resolve_city(parsed.city, city_cc, city_admin1, near) if parsed.city else None
    if parsed.city and city is None:
        unresolved.append(f"city: {parsed.city!r}")
    places = {
        "country": gazetteer.country_point(cc) if cc else None,
        "region": gazetteer.region_point(*region_key) if region_key else None,
        "city": city,
    }
    return places, unresolved


def curriculum(params: GeospotParams, progress: float) -> tuple[int, tuple[float, ...]]:
    """(stage index, level weights) at training progress in [0, 1], interpolated between stages."""
    progress = min(1.0, max(0.0, progress)) if math.isfinite(progress) else 0.0
    points, rows = params.curriculum_progress, params.curriculum_weights
    stage = max(i for i, p in enumerate(points) if p <= progress)
    if stage == len(points) - 1:
        return stage, tuple(rows[stage])
    t = (progress - points[stage]) / (points[stage + 1] - points[stage])
    return stage, tuple((1 - t) * a + t * b for a, b in zip(rows[stage], rows[stage + 1]))


def taus(params: GeospotParams, progress: float) -> tuple[float, ...]:
    """Distance scales (km) of the four levels at training progress in [0, 1]."""
    progress = min(1.0, max(0.0, progress)) if math.isfinite(progress) else 0.0
    return tuple(t * params.tau_end_factor**progress for t in params.tau_km)


def score(parsed: ParsedAnswer, truth: GeospotTruth, params: GeospotParams, progress: float,
          gazetteer: Gazetteer) -> tuple[float, dict]:
    """(reward in [0, 1], info with every component) of a parsed answer."""
    predicted, unresolved = resolve_prediction(parsed, gazetteer)
    stage, weights = curriculum(params, progress)
    level_taus = taus(params, progress)
    info: dict = {"progress": progress, "curriculum_stage": stage}
    true_places = (truth.country, truth.region, truth.city)
    weight_sum = sum(weights)
    total = weighted_sum = 0.0
    scored_ks = []
    for i, (level, weight, tau, keys) in enumerate(zip(LEVELS, weights, level_taus, _INFO_KEYS)):
        distance = _distance(level, predicted, parsed, truth, gazetteer)
        k = math.exp(-distance / tau) if distance is not None else 0.0
        info[keys[0]], info[keys[1]], info[keys[2]], info[keys[3]] = k, distance, weight / weight_sum, tau
        if i == 3 or true_places[i] is not None:  # a level the truth has no place for is not scored
            scored_ks.append(k)
            total += weight
            weighted_sum += weight * k
    if total > 0:
        content = weighted_sum / total
    else:  # the stage weighs only levels this sample cannot score: fall back to an equal mean of the rest
        content = sum(scored_ks) / len(scored_ks)
    format_reward = 1.0 if parsed.format_ok else 0.0
    reward = (1.0 - params.format_weight) * content + params.format_weight * format_reward
    info.update({
        "reward": reward,
        "content_reward": content,
        "format_reward": format_reward,
        "format_ok": parsed.format_ok,
        "inline": parsed.inline,
        "parse_failures": list(parsed.failures),
        "unresolved": unresolved,
        "truth_unresolved": list(truth.unresolved),
        "pred_country": _label_of(predicted["country"], "cc"),
        "pred_region": _label_of(predicted["region"], "region"),
        "pred_city": _label_of(predicted["city"], "city"),
        "pred_latitude": parsed.latitude,
        "pred_longitude": parsed.longitude,
        "truth_country": _label_of(truth.country, "cc"),
        "truth_region": _label_of(truth.region, "region"),
        "truth_city": _label_of(truth.city, "city"),
    })
    # numbers only, one per name: what the trainer averages and logs as reward/<name>
    info["reward_components"] = {
        **{f"k_{level}": info[f"k_{level}"] for level in LEVELS},
        "content": content, "format": format_reward,
        **{f"w_{level}": info[f"w_{level}"] for level in LEVELS},
        "curriculum_stage": float(stage),
        "parse_failures": float(len(parsed.failures)), "unresolved_names": float(len(unresolved)),
    }
    return reward, info


def _distance(level: str, predicted: dict, parsed: ParsedAnswer, truth: GeospotTruth,
              gazetteer: Gazetteer) -> float | None:
    if level == "coords":
        if parsed.coordinates is None:
            return None
        return geodesic_km(parsed.latitude, parsed.longitude, truth.latitude, truth.longitude)
    mine, true = predicted[level], getattr(truth, level)
    if mine is None or true is None:
        return None
    return gazetteer.place_distance_km(mine.index, true.index)


def _label_of(place: Place | None, what: str) -> str | None:
    if place is None:
        return None
    if what == "cc":
        return place.cc
    if what == "region":
        return f"{place.admin1}, {place.cc}"
    return place.label()
