"""The download stage: the env's builder per source, atomic raw folder, and both stage scripts end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from vlmgym import envs
from vlmgym.data import download, layout
from vlmgym.data import shard_writer as sharding
from vlmgym.data.shards import read_split
from vlmgym.envs.geospot import osv5m, synthetic
from vlmgym.envs.nlvr2 import data as nlvr2
from vlmgym.params import DataParams, ShardParams

STAGES = Path(__file__).resolve().parents[2] / "stages"


def load_stage(name: str):
    spec = importlib.util.spec_from_file_location(f"stage_{name}", STAGES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dispatch(monkeypatch):
    # each env's build_raw picks its generator or its hub loader by data.source
    calls = []
    for module, name in ((synthetic, "write_synthetic_raw"), (osv5m, "download_hub_raw"),
                         (nlvr2, "write_synthetic_raw"), (nlvr2, "download_hub_raw")):
        monkeypatch.setattr(module, name, lambda *a, _m=module, _n=name: calls.append((_m, _n)) or {})
    for env in ("geospot", "nlvr2"):
        for source in ("synthetic", "hub"):
            envs.env_class(env).build_raw(DataParams(source=source), Path("unused"))
    assert calls == [(synthetic, "write_synthetic_raw"), (osv5m, "download_hub_raw"),
                     (nlvr2, "write_synthetic_raw"), (nlvr2, "download_hub_raw")]


def test_failed_build_keeps_the_old_raw_dir(tmp_path):
    raw = tmp_path / "raw"
    layout.write_csv(layout.csv_path(raw, "train"), ["id"], [["old"]])

    def breaks_halfway(params, out):
        layout.write_csv(layout.csv_path(out, "train"), ["id"], [["new"]])
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        download.build_raw(DataParams(), envs.env_class("geospot"), raw, builder=breaks_halfway)
    assert layout.csv_path(raw, "train").read_text() == "id\nold\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]
    with pytest.raises(RuntimeError, match=r"wrote no CSV for split\(s\) \['test'\]"):
        download.build_raw(DataParams(), envs.env_class("geospot"), raw, builder=lambda p, out: layout.write_csv(
            layout.csv_path(out, "train"), ["id"], []))


def test_nlvr2_raw_through_the_shard_stage(tmp_path):
    params = DataParams(train_images=4, test_images=2, image_width=64, image_height=48)
    stats = download.build_raw(params, envs.env_class("nlvr2"), tmp_path / "raw")
    assert (stats["train_rows"], stats["test_rows"]) == (4, 2)
    manifest = sharding.shard_raw(tmp_path / "raw", tmp_path / "shards", envs.env_class("nlvr2").schema,
                                  ShardParams(val_samples=0))
    assert manifest["splits"]["train"]["kept"] == 4
    sample = read_split(tmp_path / "shards", "train")[0]
    assert len(sample.images) == 2 and isinstance(sample.meta["label"], bool) and sample.meta["sentence"]


def test_stage_scripts_log_to_mlflow(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "data": {"train_images": 12, "test_images": 4, "image_width": 64, "image_height": 48,
                 "geospot": {"num_countries": 2, "cities_per_country": 3}},
        "shard": {"shard_max_bytes": 65536}}))
    assert load_stage("download").main([]) == 0
    assert load_stage("shard").main([]) == 0
    # shard.val_samples (256) is capped at a quarter of train: 3 of the 12 rows become the val split
    train, val = read_split("data/shards", "train"), read_split("data/shards", "val")
    assert len(train) == 9 and len(val) == 3 and not {s.key for s in train} & {s.key for s in val}
    client = MlflowClient()
    runs = {r.data.tags["vlmgym.stage"]: r for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()])}
    assert runs["download"].data.metrics["train_rows"] == 12
    assert runs["download"].data.params["geospot.num_countries"] == "2"
    assert runs["shard"].data.metrics["val.kept"] == 3
    assert runs["shard"].data.metrics["test.kept"] == 4 and runs["shard"].data.params["env.name"] == "geospot"
