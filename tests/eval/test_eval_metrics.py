"""Geolocation and nlvr2 metrics on hand-computed examples, real reverse geocoding, and garbage predictions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from vlmgym.data.layout import OSV5M_COLUMNS
from vlmgym.envs.geospot.env import parse_row
from vlmgym.envs.geospot.metrics import MISSING_DISTANCE_KM, coordinate, sample_distances_km, statistics, truth_label
from vlmgym.envs.geospot.synthetic import osv5m_row
from vlmgym.eval.metrics import align_by_id, compare, evaluate, evaluate_policies, statistics_for
from vlmgym.eval.report import markdown_table

KM_PER_DEGREE = 2 * math.pi * 6371.0 / 360  # along a meridian of the 6371 km sphere
PARIS = {"latitude": 48.8566, "longitude": 2.3522, "country": "FR", "region": "Ile-de-France",
         "sub_region": "Paris", "city": "Paris"}


def record(sample_id, pred_lat, pred_lon, truth=None, reward=0.5, format_ok=True, **extra):
    """A geospot rollout record with the fields the metrics read."""
    return {"id": str(sample_id), "answer": f"Latitude: {pred_lat}\nLongitude: {pred_lon}", "pred_lat": pred_lat,
            "pred_lon": pred_lon, "truth": dict(truth or PARIS), "reward": reward, "format_ok": format_ok, **extra}


def north_of(truth, km):
    """A record predicting `km` due north of the truth (exact on the sphere)."""
    return record(f"n{km}", truth["latitude"] + km / KM_PER_DEGREE, truth["longitude"], truth)


def _places(coords):
    """A reverse geocoder that puts every point in Paris."""
    class Place:
        cc, admin1, admin2, name = "FR", "Ile-de-France", "Paris", "Paris"

    return [Place() for _ in coords]


@pytest.fixture(scope="module")
def far_away_geocoder():
    """A reverse geocoder that puts every point in a country no truth uses (area levels never match)."""
    class Nowhere:
        cc, admin1, admin2, name = "ZZ", "", "", ""

    return lambda coords: [Nowhere() for _ in coords]


def test_haversine_distances_match_hand_computation():
    truth_equator = {"latitude": 0.0, "longitude": 0.0}
    records = [record("quarter", 0.0, 90.0, truth_equator), record("antipode", 0.0, 180.0, truth_equator),
               record("degree", 1.0, 0.0, truth_equator), record("paris-london", 51.5074, -0.1278)]
    distances = sample_distances_km(records)
    assert distances[0] == pytest.approx(math.pi / 2 * 6371.0, rel=1e-12)
    assert distances[1] == pytest.approx(math.pi * 6371.0, rel=1e-12)
    assert distances[2] == pytest.approx(2 * math.pi * 6371.0 / 360, rel=1e-12)
    assert distances[3] == pytest.approx(343.56, abs=0.05)  # Paris - London, the usual great-circle figure


@pytest.mark.parametrize(("km", "score"), [(25, 4917), (200, 4373), (750, 3025), (2500, 937)])
def test_geoscore_constants(km, score, far_away_geocoder):
    metrics = evaluate("geospot", [north_of(PARIS, km)], n_resamples=10, reverse_geocoder=far_away_geocoder)
    assert metrics["mean_km"] == pytest.approx(km, rel=1e-9)
    assert round(metrics["geoscore"]) == score


def test_distance_metrics_on_a_hand_built_set(far_away_geocoder):
    kms = [0.5, 10, 100, 500, 1000, 3000]
    metrics = evaluate("geospot", [north_of(PARIS, km) for km in kms], n_resamples=10,
                       reverse_geocoder=far_away_geocoder)
    assert metrics["mean_km"] == pytest.approx(np.mean(kms), rel=1e-9)
    assert metrics["median_km"] == pytest.approx((100 + 500) / 2, rel=1e-9)
    assert metrics["geoscore"] == pytest.approx(np.mean([5000 * math.exp(-k / 1492.7) for k in kms]), rel=1e-9)
    assert metrics["acc_1km"] == pytest.approx(1 / 6)
    assert metrics["acc_25km"] == pytest.approx(2 / 6)
    assert metrics["acc_200km"] == pytest.approx(3 / 6)
    assert metrics["acc_750km"] == pytest.approx(4 / 6)
    assert metrics["acc_2500km"] == pytest.approx(5 / 6)
    assert metrics["acc_country"] == 0.0
    assert metrics["n"] == 6


def test_radius_accuracy_is_strictly_below_the_radius(far_away_geocoder):
    inside, outside = north_of(PARIS, 24.99), north_of(PARIS, 25.01)
    metrics = evaluate("geospot", [inside, outside], n_resamples=10, reverse_geocoder=far_away_geocoder)
    assert metrics["acc_25km"] == 0.5


def test_area_accuracy_reverse_geocodes_the_prediction():
    namibia = {"latitude": -22.57, "longitude": 17.08, "country": "NA", "region": "Khomas", "sub_region": "NaN",
               "city": "Windhoek"}
    records = [
        record("paris", 48.8566, 2.3522),          # Paris itself: every level right
        record("versailles", 48.8049, 2.1204),     # same region, other departement (admin2) and city
        record("lyon", 45.7640, 4.8357),           # same country only
        record("berlin", 52.52, 13.405),           # nothing right
        record("windhoek", -22.5609, 17.0658, namibia),  # 'NA' stays Namibia; Khomas has no admin2
    ]
    stats = statistics(records)
    hits = {level: stats[f"acc_{level}"].values.tolist() for level in ("country", "region", "sub_region", "city")}
    assert hits["country"] == [1, 1, 1, 0, 1]
    assert hits["region"] == [1, 1, 0, 0, 1]
    assert hits["sub_region"] == [1, 0, 0, 0, 0]  # OSV-5M: 'NaN_Khomas_NA' is never '_Khomas_NA'
    assert hits["city"] == [1, 0, 0, 0, 0]
    assert stats["acc_sub_region_lenient"].values.tolist() == [1, 0, 0, 0, 1]
    assert stats["acc_city_lenient"].values.tolist() == [1, 0, 0, 0, 1]
    metrics = evaluate("geospot", records, n_resamples=20)
    assert metrics["acc_country"] == pytest.approx(4 / 5)
    assert metrics["acc_city"] == pytest.approx(1 / 5)
    assert metrics["acc_city_lenient"] == pytest.approx(2 / 5)


def geocoder_at(*places):
    """A reverse geocoder answering the given (cc, admin1, admin2, name) places, one per point, in order."""
    def geocode(coords):
        assert len(coords) == len(places)
        return [SimpleNamespace(cc=cc, admin1=admin1, admin2=admin2, name=name) for cc, admin1, admin2, name in places]
    return geocode


def truth_at(region, sub_region, city, country="NA"):
    return {"latitude": -22.57, "longitude": 17.08, "country": country, "region": region, "sub_region": sub_region,
            "city": city}


# (truth sub_region, predicted admin2, official hit, lenient hit) for a prediction in the truth's city and admin1:
# OSV-5M's truth label spells a missing admin2 'NaN' (whether the CSV field reads '', 'NaN' or 'nan'), the
# reverse geocoder leaves it empty, so only the lenient rule can match a truth without an admin2.
ADMIN2_CASES = [
    ("Windhoek Rural", "Windhoek Rural", 1, 1),
    ("NaN", "", 0, 1),
    ("", "", 0, 1),
    ("nan", "", 0, 1),
    ("NaN", "Windhoek Rural", 0, 0),    # an admin2 the truth does not have is wrong under both rules
    ("Windhoek Rural", "", 0, 0),       # and so is a missing one where the truth has one
    ("Windhoek Rural", "Windhoek East", 0, 0),
]


@pytest.mark.parametrize(("truth_admin2", "pred_admin2", "official", "lenient"), ADMIN2_CASES)
def test_both_area_rules_on_a_truth_with_and_without_admin2(truth_admin2, pred_admin2, official, lenient):
    records = [record("w", -22.56, 17.07, truth_at("Khomas", truth_admin2, "Windhoek"))]
    stats = statistics(records, geocoder_at(("NA", "Khomas", pred_admin2, "Windhoek")))
    assert stats["acc_region"].point() == 1.0  # both rules leave the coarser levels alone
    assert (stats["acc_sub_region"].point(), stats["acc_city"].point()) == (official, official)
    assert (stats["acc_sub_region_lenient"].point(), stats["acc_city_lenient"].point()) == (lenient, lenient)


def test_area_rules_keep_a_truth_without_admin2_in_the_denominator():
    truths = [truth_at("Khomas", "Windhoek Rural", "Windhoek"), truth_at("Khomas", "NaN", "Windhoek"),
              truth_at("Khomas", "", "Windhoek"),
              {k: v for k, v in truth_at("Khomas", "X", "Windhoek").items() if k != "sub_region"}]  # unknown
    records = [record(str(i), -22.56, 17.07, t) for i, t in enumerate(truths)]
    places = [("NA", "Khomas", "Windhoek Rural", "Windhoek"), ("NA", "Khomas", "", "Windhoek"),
              ("NA", "Khomas", "", "Windhoek"), ("NA", "Khomas", "", "Windhoek")]
    metrics = evaluate("geospot", records, n_resamples=20, reverse_geocoder=geocoder_at(*places))
    # 1 of the 3 records that have a sub-region label (the fourth's is unknown and scored at neither rule)
    assert metrics["acc_sub_region"] == pytest.approx(1 / 3)
    assert metrics["acc_city"] == pytest.approx(1 / 3)
    assert metrics["acc_sub_region_lenient"] == metrics["acc_city_lenient"] == 1.0
    assert metrics["acc_country"] == metrics["acc_region"] == 1.0


def test_city_needs_the_place_name_under_both_rules():
    records = [record("w", -22.56, 17.07, truth_at("Khomas", "", "Windhoek"))]
    stats = statistics(records, geocoder_at(("NA", "Khomas", "", "Klein Windhoek")))
    assert stats["acc_sub_region_lenient"].point() == 1.0
    assert stats["acc_city_lenient"].point() == stats["acc_city"].point() == stats["acc_sub_region"].point() == 0.0


def test_official_rule_applies_to_a_missing_admin1_too():
    records = [record("a", 10.0, 20.0, truth_at("", "", "Somewhere", country="XX"))]
    stats = statistics(records, geocoder_at(("XX", "", "", "Somewhere")))
    assert stats["acc_country"].point() == 1.0
    assert stats["acc_region"].point() == 0.0  # OSV-5M's 'NaN_XX' against the reverse geocoder's '_XX'
    assert stats["acc_sub_region_lenient"].point() == stats["acc_city_lenient"].point() == 1.0


@pytest.mark.parametrize("admin2", ["Windhoek Rural", ""])
def test_truth_label_is_the_unique_column_of_the_osv5m_row(admin2):
    # The raw CSV carries OSV-5M's unique_* labels; records keep only the plain fields, so the label rebuilt from
    # them must be the CSV's (a missing admin2 spelled 'NaN' in both).
    place = {"cc": "NA", "admin1": "Khomas", "admin2": admin2, "name": "Windhoek"}
    row = dict(zip(OSV5M_COLUMNS, osv5m_row("1000000000000001", -22.56, 17.07, place)))
    truth = parse_row(row).meta  # the fields a rollout record's truth carries
    for level in ("country", "region", "sub_region", "city"):
        assert truth_label(truth, level) == row[f"unique_{level.replace('_', '-')}"]
    assert ("NaN" in truth_label(truth, "city")) == (admin2 == "")


def test_report_tables_show_the_lenient_rows_under_their_own_labels():
    records = [record("w", -22.56, 17.07, truth_at("Khomas", "NaN", "Windhoek"))]
    results = evaluate_policies("geospot", {"sft": records}, n_resamples=10,
                                reverse_geocoder=geocoder_at(("NA", "Khomas", "", "Windhoek")))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in markdown_table("geospot", results).splitlines()}
    assert rows["sub-region"].startswith("| sub-region | 0.0%")
    assert rows["city"].startswith("| city | 0.0%")
    lenient = [label for label in rows if "lenient" in label]
    assert len(lenient) == 2 and all("not OSV-5M" in label for label in lenient)
    assert all("| 100.0%" in rows[label] for label in lenient)


def test_unknown_truth_levels_leave_the_denominator_but_missing_predictions_stay():
    no_city = {k: v for k, v in PARIS.items() if k != "city"}
    records = [record("paris", 48.8566, 2.3522, no_city), record("lost", None, None), record("lyon", 45.764, 4.8357)]
    metrics = evaluate("geospot", records, n_resamples=20)
    assert metrics["acc_city"] == 0.0          # 'paris' is not scored at city level: 0 hits out of 2
    assert metrics["acc_country"] == pytest.approx(2 / 3)  # the missing prediction counts as a miss
    assert metrics["acc_region"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("garbage", [None, "north", "", float("nan"), float("inf"), 1e308, 91.0, -90.5, True,
                                     [48.0], {"lat": 48.0}])
def test_garbage_coordinates_are_format_invalid_and_worst_case(garbage, far_away_geocoder):
    records = [record("good", 48.86, 2.35, format_ok=True), record("bad", garbage, 2.35, format_ok=True)]
    metrics = evaluate("geospot", records, n_resamples=20, reverse_geocoder=far_away_geocoder)
    assert metrics["format_valid_rate"] == 0.5
    distances = sample_distances_km(records)
    assert distances[1] == MISSING_DISTANCE_KM == pytest.approx(20015.087, abs=1e-3)
    assert metrics["mean_km"] == pytest.approx((distances[0] + MISSING_DISTANCE_KM) / 2)
    assert metrics["acc_2500km"] == 0.5


def test_coordinate_reading():
    assert coordinate("48.5", 90) == 48.5
    assert coordinate(-180, 180) == -180.0
    assert coordinate(180.01, 180) is None
    assert coordinate(False, 90) is None
    assert coordinate(object(), 90) is None


def test_format_ok_from_the_env_is_respected():
    records = [record("a", 48.86, 2.35, format_ok=False), record("b", 48.86, 2.35, format_ok=True)]
    stats = statistics_for("geospot", records, reverse_geocoder=_places)
    assert stats["format_valid_rate"].point() == 0.5


def test_mean_reward_and_bad_records_are_named():
    records = [record("a", 48.86, 2.35, reward=1.0), record("b", 48.86, 2.35, reward=0.25)]
    assert evaluate("geospot", records, n_resamples=10, reverse_geocoder=_places)["mean_reward"] == 0.625
    with pytest.raises(ValueError, match=r"record 1 \(id 'b'\).*reward"):
        evaluate("geospot", [records[0], {**records[1], "reward": float("nan")}], reverse_geocoder=_places)
    with pytest.raises(ValueError, match=r"record 0 \(id 'x'\).*truth"):
        evaluate("geospot", [{"id": "x", "pred_lat": 1, "pred_lon": 2, "reward": 0}], reverse_geocoder=_places)
    with pytest.raises(ValueError, match=r"record 0.*latitude"):
        evaluate("geospot", [record("y", 1, 2, truth={"latitude": "?", "longitude": 2})], reverse_geocoder=_places)
    with pytest.raises(ValueError, match="no geospot records"):
        evaluate("geospot", [])
    with pytest.raises(KeyError, match="unknown env 'chess'"):
        evaluate("chess", records)


def test_nlvr2_accuracy_and_garbage_labels():
    truths = [True, False, True, False]
    predicted = [True, False, False, "True"]  # a string is not an answer: wrong, and format-invalid
    records = [{"id": str(i), "answer": str(p), "pred_label": p, "truth": {"label": t}, "reward": float(p is t),
                "format_ok": True} for i, (p, t) in enumerate(zip(predicted, truths))]
    metrics = evaluate("nlvr2", records, n_resamples=50)
    assert metrics["accuracy"] == 0.5
    assert metrics["format_valid_rate"] == 0.75
    assert metrics["accuracy_ci_low"] <= 0.5 <= metrics["accuracy_ci_high"]
    with pytest.raises(ValueError, match=r"record 0 .*truth.label"):
        evaluate("nlvr2", [{"id": "0", "pred_label": True, "truth": {"label": "yes"}, "reward": 1.0}])


def test_paired_comparison_aligns_by_id_and_rejects_mismatches():
    better = [north_of(PARIS, km) for km in (1, 2, 3, 4, 5, 6, 7, 8)]
    worse = [{**r, "pred_lat": r["pred_lat"] + 5} for r in better]
    diff = compare("geospot", list(reversed(better)), worse, n_resamples=200, reverse_geocoder=_places)
    assert diff["mean_km"] < 0 and diff["mean_km_ci_high"] < 0
    assert diff["geoscore"] > 0 and diff["geoscore_ci_low"] > 0
    with pytest.raises(ValueError, match="same samples: 1 ids only in treatment"):
        compare("geospot", better, worse[:-1], reverse_geocoder=_places)
    with pytest.raises(ValueError, match="appears twice"):
        align_by_id(better + better[:1], worse)


def test_evaluate_policies_adds_the_grpo_minus_sft_difference():
    sft = [north_of(PARIS, km) for km in (100, 200, 300, 400)]
    grpo = [{**r, "pred_lat": PARIS["latitude"]} for r in sft]
    results = evaluate_policies("geospot", {"sft": sft, "grpo": grpo}, n_resamples=50, reverse_geocoder=_places)
    assert set(results) == {"sft", "grpo", "grpo_minus_sft"}
    assert results["grpo_minus_sft"]["mean_km"] == pytest.approx(-250, rel=1e-6)
    assert results["grpo"]["mean_km"] == pytest.approx(0, abs=1e-6)
