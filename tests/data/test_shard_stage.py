"""The shard stage: round trip through webdataset, determinism, bad inputs, interrupted runs, nlvr2 rows."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import tarfile

import pytest
import webdataset as wds
from data_helpers import jpeg_bytes, make_raw, osv5m_row

from vlmgym import envs
from vlmgym.data import image_pool, layout
from vlmgym.data import shard_writer as sharding
from vlmgym.data.shards import read_split
from vlmgym.params import ShardParams

# One worker: these tests patch prepare_image, which worker processes would not see (tests/data/test_shard_workers.py
# covers the pool).
PARAMS = ShardParams(max_pixels=96 * 72, shard_max_bytes=64 * 1024, val_samples=0, workers=1)
GEOSPOT = envs.env_class("geospot").schema


def digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny_shards(tiny_raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards") / "shards"
    manifest = sharding.shard_raw(tiny_raw, out, GEOSPOT, PARAMS)
    return out, manifest


def test_round_trip_through_webdataset(tiny_raw, tiny_shards):
    out, manifest = tiny_shards
    with layout.csv_path(tiny_raw, "train").open(newline="") as f:
        truth = {r["id"]: r for r in csv.DictReader(f)}
    tars = sorted(str(p) for p in (out / "train").glob("*.tar"))
    assert len(tars) > 1  # shard_max_bytes = 64 kB rolls over
    seen = []
    for sample in wds.WebDataset(tars, shardshuffle=False).decode("pil"):
        meta, row = sample["json"], truth[sample["__key__"]]
        assert meta == {"id": row["id"], "latitude": float(row["latitude"]), "longitude": float(row["longitude"]),
                        "country": row["country"], "region": row["region"], "sub_region": row["sub-region"],
                        "city": row["city"]}
        assert sample["jpg"].size == (96, 72)
        seen.append(sample["__key__"])
    assert seen == sorted(truth)  # every row kept, in key order
    assert manifest["splits"]["train"]["kept"] == len(truth) and manifest["splits"]["train"]["skipped"] == {}
    assert json.loads((out / "manifest.json").read_text()) == manifest
    for shard in manifest["splits"]["train"]["shards"]:
        assert shard["bytes"] <= PARAMS.shard_max_bytes + 10240  # + tar end-of-archive padding


def test_val_split_is_held_out_of_train_by_key_hash(tiny_raw, tiny_shards, tmp_path):
    out, manifest = tiny_shards
    everything = {s.key: s.meta for s in read_split(out, "train")}
    held = tmp_path / "held"
    split = sharding.shard_raw(tiny_raw, held, GEOSPOT, dataclasses.replace(PARAMS, val_samples=2))["splits"]
    train, val = read_split(held, "train"), read_split(held, "val")
    assert split["val"]["kept"] == len(val) == 2 and split["train"]["kept"] == len(train) == len(everything) - 2
    assert {s.key for s in train} | {s.key for s in val} == set(everything)
    assert not {s.key for s in train} & {s.key for s in val}
    assert all(s.meta == everything[s.key] for s in val)
    # The choice is a function of the keys alone: the rows' order does not matter, and a larger count keeps the
    # smaller one's picks.
    rows = [sharding.Row(key=k, images=(), meta={}) for k in sorted(everything)]
    _, held_two = sharding.hold_out(rows, 2)
    assert {r.key for r in held_two} == {s.key for s in val}
    assert sharding.hold_out(rows[::-1], 2)[1] == held_two[::-1]
    assert set(map(id, held_two)) <= set(map(id, sharding.hold_out(rows, 3)[1]))
    # At most a quarter of train is held out.
    assert len(sharding.hold_out(rows, 10 ** 6)[1]) == len(rows) // 4


def test_rl_split_is_held_out_after_val_and_leaves_val_as_it_was(tiny_raw, tiny_shards, tmp_path):
    out, _ = tiny_shards
    everything = {s.key for s in read_split(out, "train")}
    only_val = sharding.shard_raw(tiny_raw, tmp_path / "val", GEOSPOT, dataclasses.replace(PARAMS, val_samples=2))
    both = sharding.shard_raw(tiny_raw, tmp_path / "both", GEOSPOT,
                              dataclasses.replace(PARAMS, val_samples=2, rl_samples=3))
    keys = {split: {s.key for s in read_split(tmp_path / "both", split)} for split in ("train", "val", "rl")}
    assert both["splits"]["rl"]["kept"] == len(keys["rl"]) == 3
    assert keys["val"] == {s.key for s in read_split(tmp_path / "val", "val")}  # rl takes from what val leaves
    assert keys["train"] | keys["val"] | keys["rl"] == everything
    assert not keys["train"] & keys["rl"] and not keys["val"] & keys["rl"]
    assert both["params"]["rl_samples"] == 3 and "rl_samples" not in only_val["params"]  # 0 leaves the bytes as before
    assert not (tmp_path / "val" / "rl").exists()
    # At most half of what val leaves.
    rows = [sharding.Row(key=k, images=(), meta={}) for k in sorted(everything)]
    assert len(sharding.hold_out(rows, 10 ** 6, key="rl_samples", share=2)[1]) == len(rows) // 2


def test_reader(tiny_shards):
    out, manifest = tiny_shards
    samples = read_split(out, "test")
    assert len(samples) == manifest["splits"]["test"]["kept"]
    assert [s.key for s in samples] == sorted(s.key for s in samples)
    assert all(len(s.images) == 1 and s.images[0].mode == "RGB" and s.meta["id"] == s.key for s in samples)
    assert [s.key for s in read_split(out, "test", limit=3)] == [s.key for s in samples[:3]]
    with pytest.raises(FileNotFoundError, match="valid"):
        read_split(out, "valid")
    # the generator's out-of-distribution split is sharded too, whole (it is not a source of val rows)
    assert manifest["splits"]["test_ood"]["kept"] == 12 and len(read_split(out, "test_ood")) == 12


def test_deterministic_output_and_resize(tiny_raw, tiny_shards, tmp_path):
    out, _ = tiny_shards
    again = tmp_path / "again"
    sharding.shard_raw(tiny_raw, again, GEOSPOT, PARAMS)
    assert digest(again) == digest(out)
    small = tmp_path / "small"
    sharding.shard_raw(tiny_raw, small, GEOSPOT,
                       ShardParams(max_pixels=32 * 32, max_train=5, max_test=2, val_samples=0))
    samples = read_split(small, "train")
    assert len(samples) == 5
    assert len(read_split(small, "test")) == len(read_split(small, "test_ood")) == 2  # max_test caps both
    width, height = samples[0].images[0].size
    assert width * height <= 32 * 32 and abs(width / height - 96 / 72) < 0.1


def test_bad_rows_are_counted_skips(tmp_path):
    good = jpeg_bytes(seed=1)
    rows = [
        osv5m_row("1001", "10.5", "20.5"),
        osv5m_row("1002", "-22.5", "17.1", country="NA", region="Khomas", city="Windhoek"),  # Namibia
        osv5m_row("1003", "91.0", "0.0"),  # latitude out of range
        osv5m_row("1004", "abc", "0.0"),
        osv5m_row("1005", "1.0", "2.0"),  # corrupt JPEG
        osv5m_row("1006", "1.0", "2.0"),  # truncated JPEG
        osv5m_row("1007", "1.0", "2.0"),  # no image in any zip
        osv5m_row("1008", "1.0", "2.0"),  # image only under an unsafe member name
        osv5m_row("1009", "1.0", "2.0") + ["extra"],  # malformed: one field too many
        osv5m_row("1001", "1.0", "2.0"),  # duplicate id
        osv5m_row("1010", "1.0", "2.0", country=""),
    ]
    members = [("1001.jpg", good), ("nested/1002.jpg", good), ("1003.jpg", good), ("1004.jpg", good),
               ("1005.jpg", b"\xff\xd8 not really a jpeg"), ("1006.jpg", good[: len(good) // 2]),
               ("../1008.jpg", good), ("/abs/1008.jpg", good), ("1009.jpg", good), ("1010.jpg", good)]
    raw = make_raw(tmp_path / "raw", {"train": rows, "test": rows[:2]}, {"train": members, "test": members[:2]})
    manifest = sharding.shard_raw(raw, tmp_path / "shards", GEOSPOT, PARAMS)
    train = manifest["splits"]["train"]
    assert train["kept"] == 2
    assert train["skipped"] == {"bad_coordinates": 2, "duplicate_id": 1, "image_corrupt": 2, "image_missing": 2,
                                "malformed_row": 1, "missing_country": 1}
    assert train["zip_members"]["unsafe"] == 2
    assert any("line 10" in e for e in train["examples"]["malformed_row"])
    namibia = {s.key: s.meta for s in read_split(tmp_path / "shards", "train")}["1002"]
    assert namibia["country"] == "NA" and namibia["city"] == "Windhoek"


def test_truncated_zip_is_a_clear_error_and_leaves_old_output(tiny_raw, tmp_path):
    raw = make_raw(tmp_path / "raw", {"train": [osv5m_row("1", "1", "1")], "test": [osv5m_row("2", "1", "1")]},
                   {"train": [("1.jpg", jpeg_bytes())], "test": [("2.jpg", jpeg_bytes())]})
    out = tmp_path / "shards"
    sharding.shard_raw(raw, out, GEOSPOT, PARAMS)
    before = digest(out)
    zip_path = layout.zip_dir(raw, "test") / "00.zip"
    zip_path.write_bytes(zip_path.read_bytes()[:-30])  # cut into the central directory
    with pytest.raises(layout.RawLayoutError, match="00.zip: not a readable zip"):
        sharding.shard_raw(raw, out, GEOSPOT, PARAMS)
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw", "shards"]  # no partial folder left


def test_missing_columns_and_all_invalid_are_errors(tmp_path):
    raw = make_raw(tmp_path / "raw", {"train": [["1", "2"]], "test": [["1", "2"]]}, {}, header=("id", "latitude"))
    with pytest.raises(sharding.ShardError, match=r"lacks column\(s\) \['longitude'"):
        sharding.shard_raw(raw, tmp_path / "out", GEOSPOT, PARAMS)
    raw = make_raw(tmp_path / "raw2", {"train": [osv5m_row("1", "95", "0")], "test": []}, {})
    with pytest.raises(sharding.ShardError, match="no valid sample.*bad_coordinates"):
        sharding.shard_raw(raw, tmp_path / "out", GEOSPOT, PARAMS)
    assert not (tmp_path / "out").exists()
    raw = make_raw(tmp_path / "raw3", {"train": [osv5m_row("1", "1", "1")], "test": []}, {})
    path = layout.csv_path(raw, "train")
    path.write_bytes(path.read_bytes() + b"2,\xff\xfe,3\n")  # not UTF-8
    with pytest.raises(layout.RawLayoutError, match="train.csv: unreadable CSV.*utf-8"):
        sharding.shard_raw(raw, tmp_path / "out", GEOSPOT, PARAMS)
    assert not (tmp_path / "out").exists()


def test_interrupted_run_leaves_no_tar_and_rerun_completes(tiny_raw, tiny_shards, tmp_path, monkeypatch):
    out = tmp_path / "shards"
    real, calls = image_pool.prepare_image, []

    def dies_midway(*args):
        calls.append(1)
        if len(calls) == 40:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(image_pool, "prepare_image", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        sharding.shard_raw(tiny_raw, out, GEOSPOT, PARAMS)
    assert list(tmp_path.rglob("*")) == []  # neither tars nor temp files
    monkeypatch.setattr(image_pool, "prepare_image", real)
    sharding.shard_raw(tiny_raw, out, GEOSPOT, PARAMS)
    assert digest(out) == digest(tiny_shards[0])


def test_nlvr2_rows_share_the_code_path(tmp_path):
    header = ("id", "sentence", "label", "left", "right")
    rows = [["p-1", "There are two dogs.", "True", "p-1-left.jpg", "p-1-right.jpg"],
            ["p.2", "  One   cat. ", "False", "p.2-left.jpg", "p.2-right.jpg"],
            ["p-3", "Bad label.", "maybe", "p-1-left.jpg", "p-1-right.jpg"],
            ["p-4", "No right image.", "True", "p-1-left.jpg", "gone.jpg"]]
    members = [(name, jpeg_bytes(seed=k)) for k, name in
               enumerate(["p-1-left.jpg", "p-1-right.jpg", "p.2-left.jpg", "p.2-right.jpg"])]
    raw = make_raw(tmp_path / "raw", {"train": rows, "test": rows[:1]}, {"train": members, "test": members},
                   header=header)
    manifest = sharding.shard_raw(raw, tmp_path / "shards", envs.env_class("nlvr2").schema, PARAMS)
    assert manifest["splits"]["train"]["skipped"] == {"bad_label": 1, "image_missing": 1}
    names = []
    for path in sorted((tmp_path / "shards" / "train").glob("*.tar")):
        with tarfile.open(path) as tar:
            names += tar.getnames()
    assert names == ["p-1.left.jpg", "p-1.right.jpg", "p-1.json", "p_2.left.jpg", "p_2.right.jpg", "p_2.json"]
    samples = read_split(tmp_path / "shards", "train")
    assert [(s.key, s.meta["id"], s.meta["label"], s.meta["sentence"]) for s in samples] == [
        ("p-1", "p-1", True, "There are two dogs."), ("p_2", "p.2", False, "One cat.")]
    assert all(len(s.images) == 2 for s in samples)
    assert samples[0].images[0].tobytes() != samples[0].images[1].tobytes()  # left and right are not swapped in
