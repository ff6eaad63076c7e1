"""`vlmgym bench shard` on a small world: JSON with one run per worker count and identical bytes."""

from __future__ import annotations

import json

import pytest

from vlmgym.bench import shard


def test_bench_shard_prints_json_with_equal_outputs(capsys):
    assert shard.main(["--images", "40", "--workers", "1", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["workers"] for r in out["runs"]] == [1, 2]
    assert out["identical_bytes"] is True
    assert all(r["images"] == 40 + 4 and r["images_per_s"] > 0 for r in out["runs"])  # val is held out of train
    assert out["speedup"] > 0


def test_bench_shard_rejects_bad_counts():
    with pytest.raises(SystemExit):
        shard.main(["--images", "0"])
    with pytest.raises(SystemExit):
        shard.main(["--workers", "-1"])
