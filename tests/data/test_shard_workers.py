"""shard.workers: the images are prepared by a process pool, and the shards are the same bytes for any count."""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing

import pytest
from data_helpers import jpeg_bytes, make_raw, osv5m_row

from vlmgym import envs
from vlmgym.data import image_pool
from vlmgym.data import shard_writer as sharding
from vlmgym.params import ShardParams

GEOSPOT = envs.env_class("geospot").schema
# Small tars so several roll over; a val hold-out, caps and (below) bad images: every path of the writer.
PARAMS = ShardParams(max_pixels=96 * 72, shard_max_bytes=48 * 1024, val_samples=6, max_test=20, workers=1)


def digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def raw_with_bad_images(tmp_path_factory):
    """A world of 150 train / 40 test rows, two of each split's images corrupt or truncated."""
    root = tmp_path_factory.mktemp("workers") / "raw"
    rows, members = {"train": [], "test": []}, {"train": [], "test": []}
    for split, count in (("train", 150), ("test", 40)):
        for i in range(count):
            key = f"{split[:2]}{i:04d}"
            rows[split].append(osv5m_row(key, f"{i % 80}.25", f"{i % 170}.5"))
            data = jpeg_bytes(64, 48, seed=i + (0 if split == "train" else 1000))
            if i in (7, 93) or (split == "test" and i == 3):
                data = data[: len(data) // 3] if i == 7 else b"\xff\xd8 not a jpeg"
            members[split].append((f"{key}.jpg", data))
    return make_raw(root, rows, members)


@pytest.fixture(scope="module")
def one_worker(raw_with_bad_images, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "shards"
    return out, sharding.shard_raw(raw_with_bad_images, out, GEOSPOT, PARAMS)


@pytest.mark.parametrize("workers", [2, 3])
def test_pool_writes_the_same_bytes_as_one_worker(raw_with_bad_images, one_worker, tmp_path, workers):
    reference, manifest = one_worker
    assert manifest["splits"]["train"]["skipped"] == {"image_corrupt": 2}
    assert manifest["splits"]["test"]["skipped"] == {"image_corrupt": 2}
    assert manifest["splits"]["test"]["kept"] == 20 and manifest["splits"]["val"]["kept"] == 6
    assert sum(len(entry["shards"]) for entry in manifest["splits"].values()) > 4  # tars rolled over
    out = tmp_path / "shards"
    pooled = sharding.shard_raw(raw_with_bad_images, out, GEOSPOT, dataclasses.replace(PARAMS, workers=workers))
    assert pooled == manifest
    assert digest(out) == digest(reference)
    assert "workers" not in manifest["params"]  # how many is not what: the manifest is the same for any count


def test_corrupt_image_errors_name_the_row(one_worker):
    _, manifest = one_worker
    examples = manifest["splits"]["train"]["examples"]["image_corrupt"]
    assert any(e.startswith("train key tr0007: ") for e in examples)
    assert all(": " in e.split("key ", 1)[1] for e in examples)  # the error type and message follow the key


def test_interrupted_pooled_run_leaves_nothing_and_stops_its_workers(raw_with_bad_images, tmp_path, monkeypatch):
    real, calls = sharding.RollingTarWriter.write, []

    def dies_midway(self, *args):
        calls.append(1)
        if len(calls) == 60:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(sharding.RollingTarWriter, "write", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        sharding.shard_raw(raw_with_bad_images, tmp_path / "shards", GEOSPOT, dataclasses.replace(PARAMS, workers=2))
    assert list(tmp_path.rglob("*")) == []  # neither tars nor temp files
    assert multiprocessing.active_children() == []


def test_results_come_back_in_task_order_from_every_block(raw_with_bad_images, monkeypatch):
    # Blocks of 2 x 2 tasks: 37 tasks cross nine block boundaries.
    monkeypatch.setattr(image_pool, "TASKS_PER_WORKER", 2)
    zip_path = str(raw_with_bad_images / "images" / "train" / "00.zip")
    tasks = [(((zip_path, f"tr{i:04d}.jpg"),), 96 * 72, 90) for i in range(37)]
    with image_pool.ImagePool(1) as inline:
        expected = list(inline.prepared(tasks))
    with image_pool.ImagePool(2) as pool:
        assert list(pool.prepared(tasks)) == expected
    assert [images is None for images, _ in expected].count(True) == 1  # tr0007 is truncated
    assert expected[7][1].startswith("OSError") or expected[7][1].startswith("SyntaxError")


def test_zero_workers_means_every_available_core():
    assert image_pool.available_cores() >= 1
    assert ShardParams().workers == 0


def test_error_messages_hold_no_memory_address(raw_with_bad_images, one_worker, tmp_path):
    # "cannot identify image file <_io.BytesIO object at 0x...>" would make every run's manifest differ.
    _, manifest = one_worker
    examples = [e for entry in manifest["splits"].values() for e in entry["examples"].get("image_corrupt", [])]
    assert any("cannot identify image file" in e for e in examples)
    assert not any(image_pool.MEMORY_ADDRESS.search(e) for e in examples)
