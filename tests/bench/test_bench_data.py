"""`vlmgym bench data` on a small world: one measured child process per scale and reader, JSON out."""

from __future__ import annotations

import json

import pytest

from vlmgym.bench import data


def test_bench_data_prints_json_per_scale_and_reader(capsys):
    argv = ["--train-images", "24", "--scales", "1", "2", "--batches", "3", "--batch-size", "4", "--model", "none"]
    assert data.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["scale"], r["reader"]) for r in out["runs"]] == [(1, "lazy"), (1, "eager"), (2, "lazy"), (2, "eager")]
    assert [r["samples"] for r in out["runs"]] == [24, 24, 48, 48]
    assert all(r["samples_per_s"] > 0 and r["peak_rss_mb"] > 10 for r in out["runs"])
    assert "lazy_rss_growth" in out


def test_bench_data_checks_its_arguments(tmp_path):
    with pytest.raises(SystemExit):
        data.main(["--scales", "0", "--model", "none"])
    with pytest.raises(SystemExit):
        data.main(["--model", str(tmp_path)])  # no model folder there
