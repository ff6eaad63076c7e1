"""The download and shard stages' one call whatever the env: one env's raw layout and shards at the top of their
folders, several (a mixture's sub-envs) each in a folder of its own name."""

from __future__ import annotations

import json

import pytest

from vlmgym import envs
from vlmgym.data import layout
from vlmgym.data.download import build_raw_envs
from vlmgym.data.shard_writer import env_schemas, shard_envs
from vlmgym.params import DataParams, EnvParams, ShardParams


def layouts(tmp_path, env_params):
    data = DataParams(seed=1, train_images=8, test_images=4, ood_images=2, image_width=96, image_height=64,
                      raw_dir=str(tmp_path / "raw"))
    classes = {name: envs.env_class(name) for name in envs.parts(env_params)}
    stats = build_raw_envs(data, classes)
    manifest = shard_envs(tmp_path / "raw", tmp_path / "shards", env_schemas(classes), ShardParams(val_samples=2))
    return stats, manifest


def test_one_env_writes_its_layout_and_shards_at_the_top(tmp_path):
    stats, manifest = layouts(tmp_path, EnvParams(name="digits"))
    assert stats["dataset"] == "digits" and stats["test_rows"] == 4
    assert layout.csv_path(tmp_path / "raw", "test").is_file() and not (tmp_path / "raw" / "parts.json").exists()
    assert manifest["dataset"] == "digits" and manifest["splits"]["test"]["kept"] == 4
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text()) == manifest
    assert (tmp_path / "shards" / "val").is_dir()


def test_a_mixture_writes_each_sub_envs_layout_and_shards_in_its_own_folder(tmp_path):
    names = ["digits", "message_decoding"]
    stats, manifest = layouts(tmp_path, EnvParams(name="mixture"))
    assert set(stats["parts"]) == set(names)
    assert json.loads((tmp_path / "raw" / "parts.json").read_text()) == {"parts": names}
    assert set(manifest["parts"]) == set(names)
    for name in names:
        assert layout.csv_path(tmp_path / "raw" / name, "test").is_file()
        assert (tmp_path / "shards" / name / "val").is_dir()
        assert manifest["parts"][name]["splits"]["test"]["kept"] == 4


def test_an_env_without_a_row_schema_cannot_be_sharded():
    class Schemaless(envs.env_class("digits")):
        name = "schemaless"
        schema = None

    with pytest.raises(ValueError, match="'schemaless' declares no row schema"):
        env_schemas({"digits": envs.env_class("digits"), "schemaless": Schemaless})
