"""An env's synthetic data through the download and shard stages' libraries, for the env tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from vlmgym import envs
from vlmgym.data.download import build_raw
from vlmgym.data.shard_writer import shard_raw
from vlmgym.params import DataParams, ShardParams


def build_shards(root: Path, params: DataParams, env: str) -> tuple[DataParams, Path, dict]:
    """Write `env`'s raw layout under root/raw and shard it (no val split) into root/shards: (params with that
    raw_dir, the shards folder, the manifest)."""
    params = replace(params, raw_dir=str(root / "raw"))
    build_raw(params, envs.env_class(env))
    manifest = shard_raw(root / "raw", root / "shards", envs.env_class(env).schema, ShardParams(val_samples=0))
    return params, root / "shards", manifest
