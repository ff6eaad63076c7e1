"""The OSV-5M hub path against a local folder in the exact hub layout, with a fake in place of hf_hub_download.

The folder is built from real OSV-5M photos (tests/data/fixtures/osv5m_sample/); the coordinates and labels
attached to them below are MADE UP (no coordinates are known for these photos).
"""

from __future__ import annotations

import csv
import dataclasses
import shutil
from pathlib import Path

import pytest
from data_helpers import osv5m_row
from PIL import Image

from vlmgym.data import layout
from vlmgym.data import shard_writer as sharding
from vlmgym.data.download import build_raw
from vlmgym.data.shards import read_split
from vlmgym.envs import env_class
from vlmgym.envs.geospot import osv5m
from vlmgym.params import DataParams, ShardParams

SAMPLE_DIR = Path(__file__).parent / "fixtures" / "osv5m_sample"

# Made-up coordinates and labels, one per photo (real OSV-5M ids).
MADE_UP = [("-33.45", "-70.66", "CL", "Santiago Metropolitan", "Provincia de Santiago", "Santiago"),
           ("59.33", "18.06", "SE", "Stockholm", "Stockholms Kommun", "Stockholm"),
           ("35.68", "139.76", "JP", "Tokyo", "", "Tokyo"),
           ("-22.56", "17.08", "NA", "Khomas", "", "Windhoek"),
           ("-33.87", "151.21", "AU", "New South Wales", "Sydney", "Sydney"),
           ("48.85", "2.35", "FR", "Ile-de-France", "Paris", "Paris"),
           ("-1.29", "36.82", "KE", "Nairobi Area", "", "Nairobi"),
           ("19.43", "-99.13", "MX", "Mexico City", "", "Mexico City")]


def photo_ids() -> list[tuple[str, Path]]:
    """(OSV-5M id, photo path) of the fixture photos, from its manifest."""
    with (SAMPLE_DIR / "manifest.csv").open(newline="") as f:
        return [(row["osv5m_id"], SAMPLE_DIR / row["file"]) for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    """A folder in the osv5m/osv5m hub layout: train has 2 zips (the second nested in a folder), test has 2."""
    root = tmp_path_factory.mktemp("hub")
    photos = photo_ids()
    rows = [osv5m_row(pid, *labels) for (pid, _), labels in zip(photos, MADE_UP)]
    members = [(f"{pid}.jpg", path.read_bytes()) for pid, path in photos]
    layout.write_csv(root / "train.csv", layout.OSV5M_COLUMNS,
                     rows[:6] + [osv5m_row("9999999999999999", "1", "1")] + [rows[0][:5]])
    layout.write_csv(root / "test.csv", layout.OSV5M_COLUMNS, rows[6:])
    layout.write_zip(root / "images/train/00.zip", members[:4])
    layout.write_zip(root / "images/train/01.zip", [(f"01/{name}", data) for name, data in members[4:6]])
    layout.write_zip(root / "images/test/00.zip", members[6:7])
    layout.write_zip(root / "images/test/01.zip", members[7:8])
    return root


class FakeHub:
    """Stands in for hf_hub_download: copies from the hub folder, records calls, can fail on chosen files."""

    def __init__(self, root: Path, fail_on: dict[str, str] | None = None):
        self.root, self.fail_on, self.calls = root, dict(fail_on or {}), []

    def __call__(self, repo_id: str, filename: str, local_dir: Path) -> Path:
        assert repo_id == "osv5m/osv5m"
        self.calls.append(filename)
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = self.fail_on.pop(filename, None)
        if mode == "connection":
            target.write_bytes((self.root / filename).read_bytes()[:100])  # a half-written file
            raise ConnectionError(f"{filename}: connection reset")
        data = (self.root / filename).read_bytes()
        target.write_bytes(data[: len(data) // 2] if mode == "truncated" else data)
        return target


def hub_params(tmp_path: Path, zips: int = 1) -> DataParams:
    return DataParams(source="hub", zips_per_split=zips, raw_dir=str(tmp_path / "raw"),
                      hub_cache_dir=str(tmp_path / "cache"))


def build(params: DataParams, fake: FakeHub) -> dict:
    return build_raw(params, env_class("geospot"), builder=lambda p, out: osv5m.download_hub_raw(p, out, fetch=fake))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_partial_download_keeps_rows_with_images(hub_folder, tmp_path):
    fake = FakeHub(hub_folder)
    stats = build(hub_params(tmp_path), fake)
    assert fake.calls == ["train.csv", "test.csv", "images/train/00.zip", "images/test/00.zip"]
    raw = tmp_path / "raw"
    assert sorted(str(p.relative_to(raw)) for p in raw.rglob("*") if p.is_file()) == [
        "images/test/00.zip", "images/train/00.zip", "test.csv", "train.csv"]
    assert layout.read_header(raw / "train.csv") == list(layout.OSV5M_COLUMNS)
    train = read_csv(raw / "train.csv")
    assert [r["id"] for r in train] == [pid for pid, _ in photo_ids()[:4]]
    assert train[3]["country"] == "NA"  # Namibia survives the CSV round trip
    details = stats["details"]
    assert details["train"]["dropped_image_missing"] == 3 and details["train"]["dropped_malformed_row"] == 1
    assert details["test"]["rows"] == 1 and details["test"]["dropped_image_missing"] == 1
    assert stats["train_rows"] == 4 and stats["train_zips"] == 1


def test_nested_zip_members_and_all_zips(hub_folder, tmp_path):
    stats = build(hub_params(tmp_path, zips=2), FakeHub(hub_folder))
    assert stats["train_rows"] == 6 and stats["test_rows"] == 2 and stats["train_zips"] == 2


def test_interrupted_download_resumes(hub_folder, tmp_path):
    params = hub_params(tmp_path)
    broken = FakeHub(hub_folder, fail_on={"images/train/00.zip": "connection"})
    with pytest.raises(ConnectionError):
        build(params, broken)
    assert not (tmp_path / "raw").exists()
    resumed = FakeHub(hub_folder)
    build(params, resumed)
    assert resumed.calls == ["images/train/00.zip", "images/test/00.zip"]  # complete files are not fetched again
    idle = FakeHub(hub_folder)
    build(params, idle)
    assert idle.calls == []
    # A cached file whose size no longer matches its record is fetched again.
    (tmp_path / "cache" / "test.csv").write_text("id\n")
    again = FakeHub(hub_folder)
    build(params, again)
    assert again.calls == ["test.csv"]


def test_truncated_zip_from_the_hub_is_refetched(hub_folder, tmp_path):
    params = hub_params(tmp_path)
    with pytest.raises(RuntimeError, match="images/test/00.zip: downloaded file is not a readable zip"):
        build(params, FakeHub(hub_folder, fail_on={"images/test/00.zip": "truncated"}))
    assert not (tmp_path / "cache" / "images/test/00.zip").exists()
    fixed = FakeHub(hub_folder)
    build(params, fixed)
    assert fixed.calls == ["images/test/00.zip"]


def test_real_photos_through_the_shard_stage(hub_folder, tmp_path):
    build(hub_params(tmp_path), FakeHub(hub_folder))
    shard_params = ShardParams(max_pixels=256 * 192, val_samples=0)
    manifest = sharding.shard_raw(tmp_path / "raw", tmp_path / "shards", env_class("geospot").schema,
                                  shard_params)
    assert manifest["splits"]["train"]["kept"] == 4 and manifest["splits"]["test"]["kept"] == 1
    samples = {s.key: s for s in read_split(tmp_path / "shards", "train")}
    for (pid, path), labels in zip(photo_ids()[:4], MADE_UP):
        width, height = samples[pid].images[0].size
        original_width, original_height = Image.open(path).size
        assert width * height <= 256 * 192 and abs(width / height - original_width / original_height) < 0.02
        assert (samples[pid].meta["latitude"], samples[pid].meta["country"]) == (float(labels[0]), labels[2])


def test_cache_survives_a_removed_raw_dir(hub_folder, tmp_path):
    """DVC deletes data/raw before rerunning the stage; the cache next to it keeps the downloads."""
    params = hub_params(tmp_path)
    build(params, FakeHub(hub_folder))
    shutil.rmtree(tmp_path / "raw")
    idle = FakeHub(hub_folder)
    build(dataclasses.replace(params), idle)
    assert idle.calls == [] and (tmp_path / "raw" / "train.csv").exists()
