"""The answer collapse check: answer spread, warnings for trained policies that give one answer to everything,
its figures in metrics/eval.json and the reports, for any env (geospot and nlvr2 here)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from vlmgym.eval.evaluate import start_policies
from vlmgym.eval.metrics import COLLAPSE_TOP_SHARE, answer_key, answer_spread, collapsed
from vlmgym.eval.outputs import answer_collapse, write_evaluation
from vlmgym.params import ModelParams, RolloutParams


def test_answer_key_folds_case_and_whitespace_only():
    assert answer_key(" True\n") == answer_key("TRUE") == "true"
    assert answer_key("Latitude: 1.0\nLongitude:  2") == "latitude: 1.0 longitude: 2"
    assert answer_key("55.1, 37.6") != answer_key("55.2, 37.6")
    assert answer_key(None) == ""


def test_answer_spread_figures():
    spread = answer_spread(["True", "true ", "False", "TRUE"])
    assert spread == {"distinct_share": 0.5, "top_share": 0.75, "top_answer": "true"}
    assert answer_spread(["a", "b"])["top_answer"] == "a"  # ties: the first seen
    with pytest.raises(ValueError):
        answer_spread([])


def nlvr2_records(answers):
    return [{"id": f"s{i}", "answer": a, "pred_label": a == "True", "reward": float((a == "True") == (i % 2 == 0)),
             "format_ok": True, "truth": {"label": i % 2 == 0, "sentence": "There is a red circle in the left image."}}
            for i, a in enumerate(answers)]


def test_a_policy_that_always_answers_the_same_is_flagged_and_a_varied_one_is_not():
    records = {"sft": nlvr2_records(["True"] * 40), "grpo": nlvr2_records(["True", "False"] * 20),
               "base": nlvr2_records(["garbage"] * 40)}
    spreads, warnings = answer_collapse(records, start_policies=["base"])
    assert spreads["sft"]["top_share"] == 1.0 and spreads["grpo"]["top_share"] == 0.5
    assert len(warnings) == 1 and "'sft'" in warnings[0] and "'true'" in warnings[0]  # base: the untrained start


def test_threshold_boundary():
    assert COLLAPSE_TOP_SHARE == 0.95
    assert collapsed(answer_spread(["True"] * 19 + ["False"]))  # 95%: collapsed
    assert not collapsed(answer_spread(["True"] * 18 + ["False"] * 2))  # 90%: not


def test_start_policies_are_the_ones_in_the_base_model_folder():
    rollout = RolloutParams(policies=["base", "sft", "grpo"], models_dir="models/jax")
    assert start_policies(rollout, ModelParams(jax_dir="models/jax/base")) == ["base"]
    assert start_policies(rollout, ModelParams(jax_dir="elsewhere/base")) == []


def geospot_records(answers):
    records = []
    for i, answer in enumerate(answers):
        truth = {"latitude": 10.0 + i, "longitude": 20.0, "country": "XX", "region": "", "sub_region": "", "city": ""}
        records.append({"id": f"g{i}", "answer": answer, "pred_lat": 10.0, "pred_lon": 20.0, "truth": truth,
                        "reward": 0.5, "format_ok": True})
    return records


def nowhere(coords):
    class Place:
        cc, admin1, admin2, name = "YY", "", "", ""

    return [Place() for _ in coords]


@pytest.mark.parametrize("env", ["geospot", "nlvr2"])
def test_the_check_runs_in_the_evaluate_outputs_of_every_env(env, tmp_path, capsys):
    if env == "geospot":
        same = geospot_records(["Latitude: 10.0\nLongitude: 20.0"] * 20)
        varied = geospot_records([f"Latitude: {10 + i}.0\nLongitude: 20.0" for i in range(20)])
        options = {"reverse_geocoder": nowhere}
    else:
        same, varied, options = nlvr2_records(["True"] * 20), nlvr2_records(["True", "False"] * 10), {}
    image = Image.new("RGB", (8, 8))
    images = {r["id"]: [image, image] for r in same}
    outputs = write_evaluation(env, {"sft": same, "grpo": varied}, images=images, out_root=tmp_path,
                               n_resamples=50, metric_options=options, max_samples=4)
    saved = json.loads((tmp_path / "metrics" / "eval.json").read_text())
    assert saved["sft"]["answers_top_share"] == 1.0 and saved["sft"]["answers_distinct_share"] == 1 / 20
    assert saved["grpo"]["answers_top_share"] == (1 / 20 if env == "geospot" else 0.5)
    assert len(outputs.warnings) == 1 and "'sft'" in outputs.warnings[0]
    table = (tmp_path / "reports" / "eval.md").read_text()
    assert "| top answer share | 100.0% |" in table and "Answer collapse check" in table
    assert "warning 1" in table and "warning 1" in (tmp_path / "reports" / "eval.html").read_text()
