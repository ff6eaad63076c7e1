"""geospot: where was this street-view photo taken? Five lines, coarse to fine, scored by geodesic distance.

The reward (reward.py) is offline and deterministic; the answer parser (parse.py) is forgiving. Data: the
synthetic world (synthetic.py, scene.py; the default) or OSV-5M from the hub (osv5m.py), both in OSV-5M's raw
layout. Metrics (metrics.py) are OSV-5M's; the report (report.py) adds the distance CDF and the world maps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.data.rows import SAFE_KEY, Row, RowSchema, RowSkip
from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.geospot import metrics, report
from vlmgym.envs.geospot.parse import parse_answer
from vlmgym.envs.geospot.reward import LEVELS, GeospotTruth, resolve_truth, score
from vlmgym.envs.geospot.settings import GeospotDataParams, GeospotParams
from vlmgym.geo.gazetteer import gazetteer
from vlmgym.geo.names import country_display_name

# Short on purpose: a tiny model is trained on it. The keys are listed in the order the answer must give them.
PROMPT = "Where was this photo taken? Answer with five lines:\nCountry:\nRegion:\nCity:\nLatitude:\nLongitude:"
CORPUS_CITIES_PER_COUNTRY = 10
TRUTH_FIELDS = ("latitude", "longitude", "country", "region", "sub_region", "city")
# record["parsed"] field -> the reward info key it comes from
PARSED_FIELDS = {"country": "pred_country", "region": "pred_region", "city": "pred_city",
                 "latitude": "pred_latitude", "longitude": "pred_longitude"}


def parse_row(rec: dict[str, str]) -> Row:
    """One OSV-5M CSV row (id, coordinates, labels) as a sample; bad ids and coordinates are counted skips."""
    image_id = rec["id"].strip()
    if not SAFE_KEY.match(image_id):
        raise RowSkip("bad_id", f"id {rec['id']!r} is not a plain token")
    try:
        lat, lon = float(rec["latitude"]), float(rec["longitude"])
    except ValueError as err:
        raise RowSkip("bad_coordinates", f"latitude {rec['latitude']!r} / longitude {rec['longitude']!r}") from err
    if not (math.isfinite(lat) and math.isfinite(lon) and -90 <= lat <= 90 and -180 <= lon <= 180):
        raise RowSkip("bad_coordinates", f"({lat}, {lon}) out of range")
    if not rec["country"]:
        raise RowSkip("missing_country", "empty country")
    meta = {"id": image_id, "latitude": lat, "longitude": lon, "country": rec["country"], "region": rec["region"],
            "sub_region": rec["sub-region"], "city": rec["city"]}
    return Row(image_id, (f"{image_id}.jpg",), meta)


class GeospotEnv(Env):
    """OSV-5M-style geolocation from one image; samples are webdataset shards with OSV-5M labels in `.json`."""

    name = "geospot"
    Params = GeospotParams
    DataParams = GeospotDataParams
    schema = RowSchema("geospot", ("id", "latitude", "longitude", "country", "region", "sub-region", "city"),
                       ("jpg",), parse_row)
    metric_rows = {
        "geoscore": ("GeoScore", "score"),
        "mean_km": ("mean distance (km)", "km"),
        "median_km": ("median distance (km)", "km"),
        **{f"acc_{radius}km": (f"within {radius} km", "rate") for radius in metrics.RADII_KM},
        "acc_country": ("country", "rate"),
        "acc_region": ("region", "rate"),
        "acc_sub_region": ("sub-region", "rate"),
        "acc_city": ("city", "rate"),
        # Extras below OSV-5M's rows, named so that nobody quotes them as OSV-5M figures (metrics.py docstring).
        "acc_sub_region_lenient": ("sub-region, lenient (not OSV-5M: a missing admin2 can match)", "rate"),
        "acc_city_lenient": ("city, lenient (not OSV-5M: a missing admin2 can match)", "rate"),
    }
    # k_<level> is exp(-d / tau) before the curriculum's weight w_<level> (reward.score's reward_components)
    reward_levels = {level: (f"k_{level}", f"w_{level}") for level in LEVELS}
    ood_note = "test's places rendered in fog or at night (data.geospot.ood_shift), which train never shows"
    # Chosen on the val split (docs/results.md, "How the geospot recipe was chosen"): 450 SFT steps leave the policy
    # partly competent (greedy val 0.317; 0.477 after 600), and sampling at 0.6 keeps GRPO's samples near the greedy
    # answer, so what it learns moves the greedy answer too (val +0.050 by step 125; +0.018 at temperature 1).
    recipe = {"sft": {"steps": 450}, "train": {"sampling": {"temperature": 0.6}}}
    # OSV-5M's photos vary in size; 682x512 (width x height) is the most common (configs/qwen3vl_4b_osv5m.yaml sets
    # shard.max_pixels to its pixel count). The question's 34 Qwen3-VL text tokens are what BENCHMARKS.md's plans of
    # the OSV-5M recipe took (370-token prompts = 336 image tokens + 34): an estimate, not a tokenization.
    hub_image_size = (512, 682)
    qwen_prompt_text_tokens = 34

    def __init__(self, samples: Sequence[SampleLike] | None = None, *, shards_dir: str = "data/shards",
                 split: str = "train", limit: int | None = None, tokenizer: Any = None,
                 params: GeospotParams | None = None, progress: float = 0.0):
        """Serve samples (given, or read from the shards) and score answers with `params` (defaults if None)."""
        super().__init__(samples, shards_dir=shards_dir, split=split, limit=limit, tokenizer=tokenizer,
                         params=params)
        self.gazetteer = gazetteer()
        self.set_progress(progress)

    def check_sample(self, sample: SampleLike) -> None:
        missing = [k for k in ("latitude", "longitude", "country") if k not in sample.meta]
        if missing:
            raise ValueError(f"geospot: sample {sample.key!r} lacks meta keys {missing}")

    @classmethod
    def describe_ood(cls, settings: Any) -> str:
        """The configured rendering shift (data.geospot.ood_shift: fog or night)."""
        shift = {"fog": "in fog", "night": "at night"}[settings.ood_shift]
        strength = "" if settings.ood_strength == 1 else f" at strength {settings.ood_strength:g}"
        return f"test's places rendered {shift}{strength} (data.geospot.ood_shift), which train never shows"

    def prompt(self, sample: SampleLike) -> str:
        """The same question for every image."""
        return PROMPT

    def prepare_truth(self, sample: SampleLike) -> GeospotTruth:
        """Resolve the labels to places once per reset, not once per answer."""
        return resolve_truth(sample.meta, self.gazetteer)

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """Parse and score an answer at the env's current training progress."""
        truth = state.truth if state.truth is not None else resolve_truth(state.meta, self.gazetteer)
        return score(parse_answer(text), truth, self.params, self.progress, self.gazetteer)

    def ideal_answer(self, meta: dict, exact: bool = False) -> str:
        """The perfect five-line answer for a sample (the SFT target): coordinates to params.answer_decimals
        decimals, or as the exact floats with exact=True."""
        decimals = None if exact else self.params.answer_decimals
        return render_answer(country_display_name(str(meta.get("country", ""))), meta.get("region"),
                             meta.get("city"), float(meta["latitude"]), float(meta["longitude"]), decimals)

    @classmethod
    def corpus(cls, cities_per_country: int = CORPUS_CITIES_PER_COUNTRY) -> list[str]:
        """Prompt plus ideal answers covering every country, every region and a bounded sample of cities.

        One answer per admin1 region (at its representative place) and per country `cities_per_country` places
        spread evenly through the table: ~6k answers, ~0.5 MB, so a BPE tokenizer sees every country and region
        name and a broad sample of city names in the exact answer layout.
        """
        gaz = gazetteer()
        texts = [PROMPT]
        for cc in gaz.countries():
            country = country_display_name(cc)
            places = [gaz.region_point(cc, admin1) for admin1 in gaz.regions(cc)] or [gaz.country_point(cc)]
            indices = gaz.country_places[cc]
            take = np.unique(np.linspace(0, len(indices) - 1, min(cities_per_country, len(indices))).astype(int))
            places += [gaz.place(indices[i]) for i in take]
            texts += [render_answer(country, p.admin1, p.name, p.lat, p.lon, 4) for p in places]
        return texts

    # --- data ------------------------------------------------------------------

    @classmethod
    def write_synthetic(cls, data: Any, out_dir: Path) -> dict:
        """The synthetic world (data.geospot) in OSV-5M's raw layout."""
        from vlmgym.envs.geospot.synthetic import write_synthetic_raw

        return write_synthetic_raw(data, out_dir, cls.data_settings(data))

    @classmethod
    def download_hub(cls, data: Any, out_dir: Path) -> dict:
        """OSV-5M's CSVs and `data.zips_per_split` image zips per split from the hub."""
        from vlmgym.envs.geospot.osv5m import download_hub_raw

        return download_hub_raw(data, out_dir)

    # --- evaluation ------------------------------------------------------------

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        """The parsed answer, the predicted coordinates and the OSV-5M truth labels."""
        return {"parsed": {field: info.get(key) for field, key in PARSED_FIELDS.items()},
                "pred_lat": info.get("pred_latitude"), "pred_lon": info.get("pred_longitude"),
                "truth": {field: meta.get(field) for field in TRUTH_FIELDS}}

    @classmethod
    def finish_record(cls, record: dict[str, Any]) -> dict[str, Any]:
        """distance_km: haversine to the truth (the OSV-5M metric), the worst case without coordinates."""
        record["distance_km"] = float(metrics.sample_distances_km([record])[0])
        return record

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        """Coordinates the metrics can use."""
        return metrics.predicted_point(record) is not None

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], reverse_geocoder: Any = None) -> dict:
        """OSV-5M's distance, GeoScore, radius and area metrics, plus the lenient sub-region and city
        accuracies (vlmgym.envs.geospot.metrics)."""
        return metrics.statistics(records, reverse_geocoder)

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        """City, region, country (coordinates)."""
        names = ", ".join(str(truth[k]) for k in ("city", "region", "country") if truth.get(k))
        return f"{names} ({float(truth['latitude']):.3f}, {float(truth['longitude']):.3f})"

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        """The distance to the truth."""
        return f"{metrics.sample_distances_km([record])[0]:.0f} km"

    @classmethod
    def report_html(cls, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], params: Any) -> str:
        """The world maps of predictions, one per policy."""
        params = params if params is not None else GeospotParams()
        return report.map_section_html(records_by_policy, params.map_base_points)

    @classmethod
    def write_report_files(cls, out_root: Path, records_by_policy: Mapping[str, Sequence[Mapping[str, Any]]],
                           params: Any) -> tuple[dict[str, Path], dict[str, Path]]:
        """The distance CDF per policy: metrics/plots/distance_cdf.csv (dvc plots) and reports/distance_cdf.png."""
        return report.write_distance_cdf(out_root, records_by_policy)


def render_answer(country: str, region: str | None, city: str | None, latitude: float, longitude: float,
                  decimals: int | None = 4) -> str:
    """Five lines in the prompt's order; an empty label leaves its value empty."""
    def number(x: float) -> str:
        return repr(float(x)) if decimals is None else f"{x:.{decimals}f}"

    if not (math.isfinite(latitude) and math.isfinite(longitude)):
        raise ValueError(f"geospot: cannot render coordinates ({latitude}, {longitude})")
    lines = [f"Country: {country}", f"Region: {region or ''}", f"City: {city or ''}",
             f"Latitude: {number(latitude)}", f"Longitude: {number(longitude)}"]
    return "\n".join(line.rstrip() for line in lines)

