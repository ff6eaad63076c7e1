"""open_split: the lazy reader serves what read_split decodes (keys, order, meta, pixels) without holding images,
and checks every tar it indexes against the sha256 the shard stage recorded."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
from data_helpers import jpeg_bytes, make_raw

from vlmgym import envs
from vlmgym.data import shard_writer as sharding
from vlmgym.data.shards import ShardIntegrityError, StoredSample, StoredSplit, open_split, read_split, split_identity
from vlmgym.params import ShardParams

PARAMS = ShardParams(max_pixels=96 * 72, shard_max_bytes=64 * 1024, val_samples=0, workers=1)


@pytest.fixture(scope="module")
def shards(tiny_raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("lazy") / "shards"
    sharding.shard_raw(tiny_raw, out, envs.env_class("geospot").schema, PARAMS)
    return out


def same(eager, lazy):
    assert [s.key for s in lazy] == [s.key for s in eager]
    for a, b in zip(eager, lazy, strict=True):
        assert b.meta == a.meta and len(b.images) == len(a.images)
        for x, y in zip(a.images, b.images, strict=True):
            assert y.mode == x.mode == "RGB" and np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("split", ["train", "test", "test_ood"])
def test_lazy_split_equals_the_decoded_one(shards, split):
    lazy = open_split(shards, split)
    assert len(list((shards / split).glob("*.tar"))) > 1 or split != "train"  # crosses tar boundaries
    same(read_split(shards, split), lazy)


@pytest.mark.parametrize("limit", [0, 1, 7, 10 ** 6])
def test_limit(shards, limit):
    assert [s.key for s in open_split(shards, "train", limit)] == [s.key for s in read_split(shards, "train", limit)]


def test_indexing_and_images_on_access(shards):
    lazy = open_split(shards, "train")
    last = lazy[-1]
    assert isinstance(last, StoredSample) and last.key == lazy[len(lazy) - 1].key
    assert [s.key for s in lazy[2:5]] == [lazy[i].key for i in range(2, 5)]
    with pytest.raises(IndexError):
        lazy[len(lazy)]
    first = lazy[0]
    # Each access decodes afresh (nothing is cached on the sample): equal pixels, distinct objects.
    assert first.images[0] is not first.images[0]
    assert first.images[0].tobytes() == first.images[0].tobytes()
    assert first.meta is not first.meta and first.meta == lazy[0].meta


def test_two_image_samples_keep_the_schema_order(tmp_path):
    header = ("id", "sentence", "label", "left", "right")
    rows = [["p-1", "Two dogs.", "True", "p-1-left.jpg", "p-1-right.jpg"]]
    members = [("p-1-left.jpg", jpeg_bytes(seed=1)), ("p-1-right.jpg", jpeg_bytes(seed=2))]
    raw = make_raw(tmp_path / "raw", {"train": rows, "test": rows}, {"train": members, "test": members},
                   header=header)
    schema = envs.env_class("nlvr2").schema
    sharding.shard_raw(raw, tmp_path / "shards", schema, PARAMS)
    same(read_split(tmp_path / "shards", "train", image_exts=schema.image_exts),
         open_split(tmp_path / "shards", "train", image_exts=schema.image_exts))
    lazy = open_split(tmp_path / "shards", "train", image_exts=schema.image_exts)[0]
    assert lazy.images[0].tobytes() != lazy.images[1].tobytes()


def write_tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_bad_shards_are_clear_errors(tmp_path):
    (tmp_path / "train").mkdir()
    write_tar(tmp_path / "train" / "shard-000000.tar", [("a.jpg", jpeg_bytes()), ("a.json", b"{}"),
                                                         ("b.jpg", jpeg_bytes())])
    with pytest.raises(ValueError, match="shard-000000.tar: sample 'b' has no .json"):
        open_split(tmp_path, "train")
    write_tar(tmp_path / "train" / "shard-000000.tar", [("a.jpg", jpeg_bytes()), ("a.json", b"{}"),
                                                         ("a.JPG", jpeg_bytes())])
    with pytest.raises(ValueError, match="duplicate file name 'a.JPG'"):
        open_split(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="no shards for split 'test'"):
        open_split(tmp_path, "test")
    # A tar cut short after indexing: the image read says where, instead of decoding garbage.
    path = tmp_path / "train" / "shard-000000.tar"
    write_tar(path, [("a.json", b"{}"), ("a.jpg", jpeg_bytes(400, 300))])
    sample = open_split(tmp_path, "train")[0]
    path.write_bytes(path.read_bytes()[:2048])
    with pytest.raises(OSError, match="truncated"):
        sample.images[0]


def test_env_over_the_shards_holds_no_decoded_image(shards):
    env = envs.make("geospot", shards_dir=str(shards), split="train")
    assert isinstance(env.samples, StoredSplit)  # an index of the tars, not a list of decoded samples
    state, obs = env.reset(3)
    eager = read_split(shards, "train")[3]
    assert state.key == eager.key and np.array_equal(np.asarray(obs["images"][0]), np.asarray(eager.images[0]))


def test_opening_a_split_allocates_a_small_fraction_of_its_pixels(shards):
    import tracemalloc

    eager = read_split(shards, "train")
    pixel_bytes = sum(len(image.tobytes()) for s in eager for image in s.images)
    tracemalloc.start()
    lazy = open_split(shards, "train")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(lazy) == len(eager) > 20
    # About 1 kB per sample (key, json bytes, tar offsets) against 20 kB of pixels of these 96x72 test images (the
    # default's 256x192 images hold 147 kB).
    assert peak / len(lazy) < 2048 and peak < pixel_bytes / 10, (peak, pixel_bytes)


def test_the_manifest_holds_each_tars_sha256(shards):
    manifest = json.loads((shards / "manifest.json").read_text())
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            assert shard["sha256"] == hashlib.sha256((shards / split / shard["name"]).read_bytes()).hexdigest()


def flip_bytes_keeping_size_and_mtime(path, at):
    """What the shard stage's own output looks like after a disk or a tool changed it behind DVC's back."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[at:at + 64] = bytes(b ^ 0xFF for b in data[at:at + 64])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


def second_sample_offsets(tar):
    """(header offset, data offset) of the second sample's first member in a tar."""
    with tarfile.open(tar) as opened:
        first, *rest = opened.getmembers()
        member = next(m for m in rest if m.name.split(".")[0] != first.name.split(".")[0])
        return member.offset, member.offset_data


RECORDED = r"sha256 .* is not the .* the shard stage recorded"
RECOVER = r"dvc checkout --relink --force data/shards.*dvc repro -f -s shard"


@pytest.mark.parametrize(("limit", "where"), [(None, "data"), (1, "data"), (None, "header")])
def test_a_tar_changed_at_the_same_size_is_an_error(shards, tmp_path, limit, where):
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    tar = copy / "train" / "shard-000000.tar"
    header, data = second_sample_offsets(tar)  # past the first sample: `limit` 1 never shows it
    flip_bytes_keeping_size_and_mtime(tar, data + 100 if where == "data" else header)
    with pytest.raises(ShardIntegrityError, match=rf"shard-000000\.tar: {RECORDED} .*{RECOVER}"):
        open_split(copy, "train", limit)
    with pytest.raises(ShardIntegrityError, match="shard-000000.tar"):
        envs.make("geospot", shards_dir=str(copy), split="train")
    assert len(open_split(copy, "test")) == len(open_split(shards, "test"))  # the other splits still read
    if where == "data":  # unchecked (vlmgym bench data's baseline), the changed image is served as it is
        assert open_split(copy, "train", verify=False)[1].key == open_split(shards, "train")[1].key


def test_tars_the_manifest_does_not_list_are_errors(shards, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    extra = copy / "train" / "shard-000099.tar"
    shutil.copy(copy / "train" / "shard-000000.tar", extra)
    with pytest.raises(ShardIntegrityError, match=r"shard-000099\.tar is not in .*manifest\.json.*dvc checkout"):
        open_split(copy, "train")
    extra.unlink()
    (copy / "train" / "shard-000001.tar").unlink()
    with pytest.raises(ShardIntegrityError, match=r"shard-000001\.tar is listed in .*manifest\.json but missing"):
        open_split(copy, "train")


def test_shards_without_checksums_are_read_with_a_warning(shards, tmp_path, caplog):
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for entry in manifest["splits"].values():
        for shard in entry["shards"]:
            del shard["sha256"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="vlmgym.data.shards"):
        same(read_split(shards, "train"), open_split(copy, "train"))
    assert "no sha256 per tar" in caplog.text and "dvc repro -f -s shard" in caplog.text


def test_split_identity_follows_the_tars_content(shards, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    recorded = split_identity(copy, "train")
    assert recorded == split_identity(shards, "train") and split_identity(copy, "absent") is None
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["sha256"] = "0" * 64  # as a rewritten tar would record
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert split_identity(copy, "train") != recorded
    # without checksums (shards from before they were recorded) every byte is hashed instead
    for shard in manifest["splits"]["train"]["shards"]:
        del shard["sha256"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    unchecked = split_identity(copy, "train")
    flip_bytes_keeping_size_and_mtime(copy / "train" / "shard-000000.tar", 1024)
    assert split_identity(copy, "train") != unchecked
