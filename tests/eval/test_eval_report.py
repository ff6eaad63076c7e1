"""The HTML report is self-contained and shows every sample; markdown table; DVC plot data and PNGs."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlmgym.envs.geospot.metrics import MISSING_DISTANCE_KM
from vlmgym.envs.geospot.report import basemap_points, map_segments, plot_distance_cdf_png, write_distance_cdf_csv
from vlmgym.envs.geospot.settings import GeospotParams
from vlmgym.eval.metrics import evaluate_policies
from vlmgym.eval.outputs import mlflow_metrics, write_evaluation
from vlmgym.eval.report import markdown_table, render_html, thumbnail_data_uri, write_html, write_markdown
from vlmgym.stats.plots import plot_reward_curve_png, write_reward_curve_csv

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "osv5m-sample" / "images"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def nowhere(coords):
    """A reverse geocoder placing every point in a country no truth uses."""
    class Place:
        cc, admin1, admin2, name = "YY", "", "", ""

    return [Place() for _ in coords]


@pytest.fixture(scope="module")
def images():
    """Six real OSV-5M photos (from the shared fixture when present, else rendered gradients), keyed by id."""
    paths = sorted(FIXTURES.glob("*.jpg"))[:6] if FIXTURES.is_dir() else []
    if paths:
        return {p.stem: [Image.open(p).convert("RGB")] for p in paths}
    gradient = np.linspace(0, 255, 64 * 96, dtype=np.uint8).reshape(64, 96)
    return {f"img{i}": [Image.fromarray(np.stack([gradient, gradient[::-1], gradient * 0 + 40 * i], -1))]
            for i in range(6)}


@pytest.fixture(scope="module")
def policies(images):
    """sft and grpo records on the same samples (made-up truths), including garbage and an antimeridian case."""
    truths = [(48.85, 2.35), (-33.87, 151.21), (40.71, -74.0), (35.68, 139.69), (-1.29, 36.82), (64.14, -21.94)]
    sft, grpo = [], []
    for sample_id, lat_lon in zip(images, truths):
        truth = {"latitude": lat_lon[0], "longitude": lat_lon[1], "country": "XX", "region": "", "sub_region": "",
                 "city": ""}
        sft.append({"id": sample_id, "answer": f"Latitude: {lat_lon[0] + 3}\nLongitude: {lat_lon[1] + 4}",
                    "pred_lat": lat_lon[0] + 3, "pred_lon": lat_lon[1] + 4, "truth": truth, "reward": 0.2,
                    "format_ok": True})
        grpo.append({**sft[-1], "answer": "<script>alert(1)</script> Latitude: 1", "pred_lat": lat_lon[0] + 0.2,
                     "pred_lon": lat_lon[1] - 0.2, "reward": 0.7})
    sft[1] = {**sft[1], "pred_lat": -30.0, "pred_lon": -170.0}  # Sydney -> across the antimeridian
    sft[2] = {**sft[2], "answer": "I cannot tell", "pred_lat": None, "pred_lon": "garbage", "format_ok": False}
    sft[3] = {**sft[3], "answer": None, "pred_lat": "12abc", "parsed": {"latitude": [1, 2]}, "format_ok": "yes?"}
    return {"sft": sft, "grpo": grpo}


@pytest.fixture(scope="module")
def page(images, policies):
    results = evaluate_policies("geospot", policies, n_resamples=100, reverse_geocoder=nowhere)
    return render_html("geospot", results, policies, images, env_params=GeospotParams(map_base_points=3))


def test_page_is_self_contained(page):
    assert "http" not in page.lower()  # no external URL of any kind
    assert re.findall(r"\bhref\s*=", page) == []
    sources = re.findall(r'\bsrc\s*=\s*"([^"]*)"', page)
    assert sources and all(s.startswith("data:image/jpeg;base64,") for s in sources)
    assert "url(" not in page and "@import" not in page
    assert "<script>" not in page  # model text is escaped, never markup


def test_page_embeds_every_sample_image_and_its_outcome(page, images):
    for sample_id, sample_images in images.items():
        assert thumbnail_data_uri(sample_images[0]) in page
        assert f'id="sample-{sample_id}"' in page
    assert page.count("<img ") == len(images)
    assert "I cannot tell" in page and f"{MISSING_DISTANCE_KM:.0f} km" in page  # the missing answer's worst case
    assert "grpo_minus_sft" in page and "GeoScore" in page
    assert page.count("format invalid") == 2  # 'I cannot tell', and a stray "yes?" flag with unusable coordinates


def test_page_draws_a_map_per_policy(page, policies):
    assert page.count("<svg ") == 2
    assert page.count('class="truth"') == 2 * len(policies["grpo"])
    # grpo: one line per answer; sft: two answers without usable coordinates, one split at the antimeridian
    assert page.count('class="pred"') == len(policies["grpo"]) + len(policies["sft"]) - 2
    assert page.count('class="link"') == len(policies["grpo"]) + len(policies["sft"]) - 1


def test_map_segments_split_at_the_antimeridian():
    assert map_segments(10, 20, 30, 40) == [(10, 20, 30, 40)]
    first, second = map_segments(-30.0, 170.0, -40.0, -170.0)
    assert first == (-30.0, 170.0, pytest.approx(-35.0), 180.0)
    assert second == (pytest.approx(-35.0), -180.0, -40.0, -170.0)


def test_write_html_and_markdown_atomically(tmp_path, images, policies):
    results = {"sft": {"n": 6.0, "geoscore": 3000.0, "geoscore_ci_low": 2500.0, "geoscore_ci_high": 3500.0,
                       "acc_country": 0.5, "acc_country_ci_low": 0.25, "acc_country_ci_high": 0.75},
               "grpo_minus_sft": {"n": 6.0, "geoscore": 120.0, "geoscore_ci_low": 20.0, "geoscore_ci_high": 220.0,
                                  "acc_country": float("nan")}}
    table = markdown_table("geospot", results)
    assert "| metric | sft | grpo_minus_sft |" in table
    assert "| GeoScore | 3000 [2500, 3500] | +120 [+20, +220] |" in table
    assert "| country | 50.0% [25.0%, 75.0%] | n/a |" in table
    write_markdown(tmp_path / "reports" / "eval.md", "geospot", results)
    write_html(tmp_path / "reports" / "eval.html", "geospot", results, policies, images)
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == ["eval.html", "eval.md"]
    assert (tmp_path / "reports" / "eval.md").read_text().startswith("# Evaluation\n")


def test_nlvr2_page_shows_both_images_and_no_map(images):
    left, right = list(images.values())[:2]
    records = [{"id": "pair0", "answer": "True", "pred_label": True, "truth": {"label": True, "sentence": "Two dogs."},
                "reward": 1.0, "format_ok": True}]
    results = {"grpo": {"n": 1.0, "accuracy": 1.0, "accuracy_ci_low": 1.0, "accuracy_ci_high": 1.0}}
    html_page = render_html("nlvr2", results, {"grpo": records}, {"pair0": left + right})
    assert html_page.count("<img ") == 2 and "<svg" not in html_page
    assert "Two dogs. -&gt; True" in html_page and "correct" in html_page


def test_basemap_is_a_seeded_subsample_of_the_gazetteer():
    points = basemap_points(max_points=3000, seed=0)
    assert points.shape == (3000, 2)
    assert np.all(np.abs(points[:, 0]) <= 90) and np.all(np.abs(points[:, 1]) <= 180)
    assert np.array_equal(points, basemap_points(max_points=3000, seed=0))
    assert len(np.unique(points, axis=0)) > 2900  # distinct places, spread out


def test_distance_cdf_and_reward_curve_files(tmp_path):
    distances = {"sft": [5.0, 50.0, 500.0, MISSING_DISTANCE_KM], "grpo": [0.5, 5.0, 30.0, 100.0]}
    rows = write_distance_cdf_csv(tmp_path / "plots" / "distance_cdf.csv", distances)
    with open(tmp_path / "plots" / "distance_cdf.csv") as handle:
        read = list(csv.DictReader(handle))
    assert list(read[0]) == ["distance_km", "sft", "grpo"] and len(read) == len(rows)
    by_km = {row["distance_km"]: row for row in rows}
    assert by_km[25.0] == {"distance_km": 25.0, "sft": 0.25, "grpo": 0.5}
    assert rows[-1]["sft"] == 1.0 and rows[-1]["grpo"] == 1.0  # the worst-case distance is on the grid
    for policy in distances:
        assert np.all(np.diff([row[policy] for row in rows]) >= 0)

    curve = write_reward_curve_csv(tmp_path / "plots" / "train_reward.csv", [(2, 0.3), (0, 0.1), (1, 0.2)])
    assert [row["step"] for row in curve] == [0, 1, 2]
    assert (tmp_path / "plots" / "train_reward.csv").read_text() == "step,reward\n0,0.1\n1,0.2\n2,0.3\n"
    with pytest.raises(ValueError, match="entry 1 .*non-finite"):
        write_reward_curve_csv(tmp_path / "bad.csv", [(0, 0.1), (1, float("nan"))])
    assert not (tmp_path / "bad.csv").exists()

    plot_distance_cdf_png(tmp_path / "distance_cdf.png", distances)
    plot_reward_curve_png(tmp_path / "train_reward.png", [(0, 0.1), (1, 0.2), (2, 0.3)])
    for name in ("distance_cdf.png", "train_reward.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_write_evaluation_writes_every_output(tmp_path, images, policies):
    outputs = write_evaluation("geospot", policies, images, out_root=tmp_path, reward_curve=[(0, 0.1), (5, 0.4)],
                               n_resamples=50, max_samples=4, env_params=GeospotParams(map_base_points=500),
                               metric_options={"reverse_geocoder": nowhere})
    assert set(outputs.results) == {"sft", "grpo", "grpo_minus_sft"}
    assert sorted(str(p.relative_to(tmp_path)) for p in outputs.files.values()) == sorted(
        ["metrics/eval.json", "metrics/headline.json", "reports/eval.md", "reports/eval.html",
         "metrics/plots/distance_cdf.csv",
         "reports/distance_cdf.png", "metrics/plots/train_reward.csv", "reports/train_reward.png"])
    assert json.loads(outputs.files["metrics"].read_text())["grpo"]["n"] == len(policies["grpo"])
    page = outputs.files["html"].read_text()
    assert page.count('<img src="data:image/jpeg') == 4 and "show 4 of the 6 test samples" in page
    assert page.count("data:image/png;base64,") == 2  # the distance CDF and the reward curve, embedded
    assert mlflow_metrics(outputs.results)["grpo_minus_sft/geoscore"] == outputs.results["grpo_minus_sft"]["geoscore"]
    leftovers = [p for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_ood_records_get_their_own_metrics_beside_the_in_distribution_ones(tmp_path, images, policies):
    # the OOD split: the same samples answered worse (a shift), so every OOD column differs from its test column
    ood = {p: [{**r, "id": f"ood-{r['id']}", "reward": r["reward"] / 2} for r in records]
           for p, records in policies.items()}
    outputs = write_evaluation("geospot", policies, images, out_root=tmp_path, n_resamples=50,
                               env_params=GeospotParams(map_base_points=0),
                               metric_options={"reverse_geocoder": nowhere}, ood_records_by_policy=ood)
    expected = evaluate_policies("geospot", ood, n_resamples=50, reverse_geocoder=nowhere)
    assert set(outputs.results) == {"sft", "grpo", "grpo_minus_sft", "sft_test_ood", "grpo_test_ood",
                                    "grpo_minus_sft_test_ood"}
    for key in ("sft", "grpo", "grpo_minus_sft"):
        assert outputs.results[f"{key}_test_ood"] == expected[key]
    assert outputs.results["grpo_test_ood"]["mean_reward"] == pytest.approx(0.35)
    saved = json.loads(outputs.files["metrics"].read_text())
    assert saved["sft_test_ood"]["mean_reward"] == pytest.approx(0.1)
    table = outputs.files["table"].read_text()
    heading = "## In distribution (test) and out of it (test_ood: test's places rendered in fog or at night"
    assert heading in table
    side = table[table.index(heading):]
    assert "| metric | sft (test) | sft (test_ood) | grpo (test) | grpo (test_ood) | grpo_minus_sft (test) | " \
           "grpo_minus_sft (test_ood) |" in side
    assert "| mean reward | 0.200 [0.200, 0.200] | 0.100 [0.100, 0.100] |" in side
    page = outputs.files["html"].read_text()
    assert "<th>grpo_minus_sft (test_ood)</th>" in page and "out of it (test_ood" in page
    # the gallery stays in-distribution: OOD ids are not shown
    assert "ood-" not in page
