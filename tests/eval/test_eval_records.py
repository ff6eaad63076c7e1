"""Rollout records from env steps, JSONL round trip, and the metrics JSON DVC reads."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from vlmgym.envs.geospot.metrics import MISSING_DISTANCE_KM
from vlmgym.envs.nlvr2 import NLVR2Env
from vlmgym.eval.metrics import evaluate
from vlmgym.eval.records import read_jsonl, rollout_record, write_jsonl, write_metrics_json

GEOSPOT_META = {"id": "0042", "latitude": 48.8566, "longitude": 2.3522, "country": "FR", "region": "Ile-de-France",
                "sub_region": "Paris", "city": "Paris"}


def geospot_info(lat, lon, format_ok=True):
    """The fields of a geospot step's info that records read (names as vlmgym.envs.geospot.reward writes them)."""
    return {"pred_country": "FR", "pred_region": "Ile-de-France", "pred_city": "Paris", "pred_latitude": lat,
            "pred_longitude": lon, "format_ok": format_ok, "k_country": 1.0, "k_coords": np.float64(0.9),
            "d_coords_km": 1.2, "content_reward": 0.95, "format_reward": 1.0, "progress": 0.5}


def test_geospot_record_has_the_schema_and_distance():
    record = rollout_record("geospot", "0042", "Country: France ...", 0.9, geospot_info(51.5074, -0.1278), GEOSPOT_META,
                            policy="grpo")
    assert record["id"] == "0042" and record["policy"] == "grpo" and record["env"] == "geospot"
    assert (record["pred_lat"], record["pred_lon"]) == (51.5074, -0.1278)
    assert record["parsed"]["country"] == "FR"
    assert record["truth"] == {k: v for k, v in GEOSPOT_META.items() if k != "id"}
    assert record["distance_km"] == pytest.approx(343.56, abs=0.05)
    assert record["reward_components"] == {"k_country": 1.0, "k_coords": 0.9, "d_coords_km": 1.2,
                                           "content_reward": 0.95, "format_reward": 1.0}
    assert type(record["reward_components"]["k_coords"]) is float
    missing = rollout_record("geospot", "0042", "no idea", 0.0, geospot_info(None, float("nan"), False), GEOSPOT_META)
    assert missing["pred_lon"] is None and missing["distance_km"] == MISSING_DISTANCE_KM
    assert missing["format_ok"] is False


def test_nlvr2_record_from_a_real_env_step():
    image = Image.new("RGB", (8, 8))
    sample = SimpleNamespace(key="k0", images=[image, image], meta={"id": "p0", "sentence": "A red cube.",
                                                                     "label": False})
    env = NLVR2Env(samples=[sample])
    state, _ = env.reset(0)
    records = []
    for answer in ("False", "true", "maybe"):
        _, _, reward, _, info = env.step_text(state, answer)
        records.append(rollout_record("nlvr2", "p0", answer, reward, info, sample.meta, policy="sft"))
    assert [r["pred_label"] for r in records] == [False, True, None]
    assert [r["reward"] for r in records] == [1.0, 0.0, 0.0]
    assert records[0]["truth"] == {"label": False, "sentence": "A red cube."}
    assert records[0]["reward_components"] == {"correct": 1.0}
    metrics = evaluate("nlvr2", [{**r, "id": str(i)} for i, r in enumerate(records)], n_resamples=20)
    assert metrics["accuracy"] == pytest.approx(1 / 3)


def test_unknown_env_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown env 'chess'"):
        rollout_record("chess", "1", "e4", 0.0, {}, {})


def test_jsonl_round_trip_and_malformed_lines(tmp_path):
    records = [rollout_record("geospot", str(i), "a\nb", 0.5, geospot_info(10.0 + i, 20.0), GEOSPOT_META)
               for i in range(3)]
    path = tmp_path / "rollouts" / "grpo.jsonl"
    assert write_jsonl(path, records) == 3
    assert read_jsonl(path) == records
    path.write_text(path.read_text() + "\n{not json\n")
    with pytest.raises(ValueError, match=r"grpo.jsonl:5: not valid JSON"):
        read_jsonl(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"grpo.jsonl:1: expected a JSON object"):
        read_jsonl(path)


def test_metrics_json_has_no_nan(tmp_path):
    write_metrics_json(tmp_path / "metrics" / "eval.json", {"grpo": {"acc_city": math.nan, "geoscore": 3000.0}})
    text = (tmp_path / "metrics" / "eval.json").read_text()
    assert "NaN" not in text
    assert json.loads(text) == {"grpo": {"acc_city": None, "geoscore": 3000.0}}


def test_geospot_records_from_real_env_steps_score_as_expected():
    from vlmgym.envs.geospot import GeospotEnv
    from vlmgym.geo import gazetteer

    paris = gazetteer().reverse(48.8566, 2.3522)  # labels exactly as OSV-5M makes them
    meta = {"id": "7", "latitude": 48.8566, "longitude": 2.3522, "country": paris.cc, "region": paris.admin1,
            "sub_region": paris.admin2, "city": paris.name}
    env = GeospotEnv(samples=[SimpleNamespace(key="7", images=[Image.new("RGB", (8, 8))], meta=meta)])
    state, _ = env.reset(0)
    records = {}
    for policy, answer in (("grpo", env.ideal_answer(meta)), ("sft", "Somewhere sunny, I think.")):
        _, _, reward, _, info = env.step_text(state, answer)
        records[policy] = [rollout_record("geospot", "7", answer, reward, info, meta, policy=policy)]
    good, bad = records["grpo"][0], records["sft"][0]
    assert good["format_ok"] and good["distance_km"] < 0.01 and good["reward"] > 0.99
    assert not bad["format_ok"] and bad["pred_lat"] is None and bad["distance_km"] == MISSING_DISTANCE_KM
    good_metrics = evaluate("geospot", records["grpo"], n_resamples=10)
    assert [good_metrics[f"acc_{level}"] for level in ("country", "region", "sub_region", "city")] == [1.0] * 4
    assert good_metrics["format_valid_rate"] == 1.0 and good_metrics["acc_1km"] == 1.0
    bad_metrics = evaluate("geospot", records["sft"], n_resamples=10)
    assert bad_metrics["format_valid_rate"] == 0.0 and bad_metrics["acc_country"] == 0.0
