"""`vlmgym bench shard`: images/s of the shard stage with one worker and with every core, on a scaled-up world.

Writes a synthetic geospot world of `--images` train images (plus a tenth as many test images) in a temp folder,
shards it once per worker count with the default shard settings, checks that every count wrote the same bytes,
and prints one JSON object. Nothing is left behind.

    vlmgym bench shard [--images 4000] [--workers 1 0]   (0: every available core)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import tempfile
import time
from pathlib import Path

from vlmgym.data.download import build_raw
from vlmgym.data.image_pool import available_cores
from vlmgym.data.shard_writer import shard_raw
from vlmgym.params import DataParams, ShardParams


def tree_digest(root: Path) -> str:
    """One hash over every file's relative path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def run(images: int, worker_counts: list[int], seed: int = 0) -> dict:
    """Time shard_raw at each worker count over one generated world; returns the figures."""
    from vlmgym.envs import env_class

    schema = env_class("geospot").schema
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-shard-") as tmp:
        raw = Path(tmp) / "raw"
        data = DataParams(seed=seed, train_images=images, test_images=max(1, images // 10), ood_images=0)
        started = time.perf_counter()
        build_raw(data, env_class("geospot"), raw_dir=raw)
        out: dict = {"env": "geospot", "train_images": images, "test_images": data.test_images,
                     "generate_s": round(time.perf_counter() - started, 2), "cores": available_cores(),
                     "machine": platform.platform(), "runs": []}
        digests = set()
        for workers in worker_counts:
            params = dataclasses.replace(ShardParams(), workers=workers)
            shards = Path(tmp) / f"shards-{workers}"
            started = time.perf_counter()
            manifest = shard_raw(raw, shards, schema, params)
            seconds = time.perf_counter() - started
            written = sum(entry["kept"] for entry in manifest["splits"].values())
            out["runs"].append({"workers": workers or available_cores(), "images": written,
                                "seconds": round(seconds, 2), "images_per_s": round(written / seconds, 1)})
            digests.add(tree_digest(shards))
        out["identical_bytes"] = len(digests) == 1
        if len(out["runs"]) > 1:
            out["speedup"] = round(out["runs"][-1]["images_per_s"] / out["runs"][0]["images_per_s"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run, print the JSON."""
    parser = argparse.ArgumentParser(prog="vlmgym bench shard", description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000, help="synthetic train images (test: a tenth)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 0],
                        help="worker counts to time, in order (0: every available core)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic world")
    args = parser.parse_args(argv)
    if args.images < 1 or any(w < 0 for w in args.workers):
        parser.error("--images must be >= 1 and --workers >= 0")
    result = run(args.images, args.workers, args.seed)
    print(json.dumps(result, indent=1))
    return 0 if result["identical_bytes"] else 1
