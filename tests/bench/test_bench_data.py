"""`vlmgym bench data` on a small world: one measured child process per scale and reader, JSON out."""

from __future__ import annotations

import json

import pytest

from vlmgym.bench import data

pytestmark = pytest.mark.slow


def test_bench_data_prints_json_per_scale_and_reader(capsys):
    argv = ["--train-images", "24", "--scales", "1", "2", "--batches", "3", "--batch-size", "4", "--model", "none"]
    assert data.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["scale"], r["reader"]) for r in out["runs"]] == [(1, "lazy"), (1, "eager"), (2, "lazy"), (2, "eager")]
    assert [r["samples"] for r in out["runs"]] == [24, 24, 48, 48]
    assert all(r["samples_per_s"] > 0 and r["peak_rss_mb"] > 10 for r in out["runs"])
    assert "lazy_rss_growth" in out
    assert all(r["index_s"] > 0 for r in out["runs"] if r["reader"] == "lazy") and "verify_index_s" not in out


def test_bench_data_measures_what_checking_the_tars_costs(capsys):
    argv = ["--train-images", "24", "--scales", "1", "--batches", "2", "--batch-size", "4", "--model", "none",
            "--reader", "lazy", "unverified"]
    assert data.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    lazy, unverified = out["runs"]
    assert (lazy["reader"], unverified["reader"]) == ("lazy", "unverified") and lazy["samples"] == 24
    assert out["verify_index_s"] == {"1": round(lazy["index_s"] - unverified["index_s"], 3)}


def test_bench_data_checks_its_arguments(tmp_path):
    with pytest.raises(SystemExit):
        data.main(["--scales", "0", "--model", "none"])
    with pytest.raises(SystemExit):
        data.main(["--model", str(tmp_path)])  # no model folder there
