"""`vlmgym bench data`: the training input pipeline's samples/s and peak memory, at the default split and scaled up.

For each scale it writes a synthetic geospot world of `scale x --train-images` train images in a temp folder,
shards it, and runs the train stage's data side in a fresh process: the env over the shards (the lazy reader),
a seeded walk of `--batches` batches of `--batch-size` resets (decoding the images) and, with `--model`, the
processor that turns them into model inputs (resize, patchify, tokenize). That process reports samples/s and its
peak RSS, and the seconds the lazy reader took to index the split (`index_s`); `--reader eager` decodes the whole
split up front instead (the reader before the lazy one), and `--reader unverified` is the lazy reader without
checking each tar against the manifest's sha256 (seeking over the images instead of reading them), for comparison.
Prints one JSON object; nothing is left behind.

    vlmgym bench data [--model models/hf/base | none] [--scales 1 10] [--reader lazy unverified eager]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(shards: str, reader: str, model: str, batches: int, batch_size: int, seed: int) -> dict:
    """The data side of a training run over `shards` (in this process); its figures."""
    from vlmgym import envs
    from vlmgym.data.shards import open_split, read_split
    from vlmgym.rl.loop import DataOrder

    started = time.perf_counter()
    index_s = None
    if reader == "eager":
        samples = read_split(shards, "train")
    else:  # the split the env would open itself, timed alone
        indexing = time.perf_counter()
        samples = open_split(shards, "train", image_exts=envs.env_class("geospot").schema.image_exts,
                             verify=reader == "lazy")
        index_s = round(time.perf_counter() - indexing, 3)
    env = envs.make("geospot", samples=samples, shards_dir=shards, split="train")
    processor = None
    if model != "none":
        from vlmgym.models.qwen3_vl.processor import Processor

        processor = Processor.from_pretrained(model)
    opened = time.perf_counter() - started
    order = DataOrder(len(env), seed)
    started = time.perf_counter()
    for _ in range(batches):
        observations = [env.reset(i)[1] for i in order.take(batch_size)]
        if processor is not None:
            processor([o["messages"] for o in observations], [o["images"] for o in observations])
    seconds = time.perf_counter() - started
    return {"reader": reader, "samples": len(env), "open_s": round(opened, 2), "index_s": index_s,
            "samples_per_s": round(batches * batch_size / seconds, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def world(root: Path, train_images: int, seed: int) -> Path:
    """A sharded synthetic geospot world of `train_images` train images under root; returns the shards folder."""
    from vlmgym.data.download import build_raw
    from vlmgym.data.shard_writer import shard_raw
    from vlmgym.envs import env_class
    from vlmgym.params import DataParams, ShardParams

    data = DataParams(seed=seed, train_images=train_images, test_images=10, ood_images=0)
    build_raw(data, env_class("geospot"), raw_dir=root / "raw")
    shard_raw(root / "raw", root / "shards", env_class("geospot").schema, ShardParams(val_samples=0))
    return root / "shards"


def run(train_images: int, scales: list[int], readers: list[str], model: str, batches: int, batch_size: int,
        seed: int = 0) -> dict:
    """Every (scale, reader) in its own process; the figures, and the lazy reader's peak RSS growth at the
    largest scale over the smallest."""
    out: dict = {"env": "geospot", "train_images": train_images, "batches": batches, "batch_size": batch_size,
                 "processor": model, "machine": platform.platform(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="vlmgym-bench-data-") as tmp:
        for scale in scales:
            started = time.perf_counter()
            shards = world(Path(tmp) / f"x{scale}", train_images * scale, seed)
            build_s = round(time.perf_counter() - started, 1)
            for reader in readers:
                command = [sys.executable, "-m", "vlmgym.bench.data", "--child", str(shards), "--reader", reader,
                           "--model", model, "--batches", str(batches), "--batch-size", str(batch_size),
                           "--seed", str(seed)]
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"bench data: the {reader} reader at scale {scale} failed:\n{done.stderr}")
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                out["runs"].append({"scale": scale, "world_build_s": build_s, **figures})
    lazy = [r for r in out["runs"] if r["reader"] == "lazy"]
    if len(lazy) > 1:
        out["lazy_rss_growth"] = round(lazy[-1]["peak_rss_mb"] / lazy[0]["peak_rss_mb"] - 1, 3)
    # what checking the tars' sha256 adds to indexing the split, per scale
    unverified = {r["scale"]: r["index_s"] for r in out["runs"] if r["reader"] == "unverified"}
    if unverified and lazy:
        out["verify_index_s"] = {r["scale"]: round(r["index_s"] - unverified[r["scale"]], 3) for r in lazy
                                 if r["scale"] in unverified}
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run (or be the measured child process), print the JSON."""
    parser = argparse.ArgumentParser(prog="vlmgym bench data", description=__doc__.splitlines()[0])
    parser.add_argument("--train-images", type=int, default=2000, help="train images at scale 1 (the default's)")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10], help="multiples of --train-images")
    parser.add_argument("--reader", nargs="+", default=["lazy", "eager"], choices=("lazy", "unverified", "eager"),
                        help="lazy: the env's reader; unverified: lazy without checking the tars' sha256; eager: "
                             "decode the split up front (the old reader)")
    parser.add_argument("--model", default="models/hf/base",
                        help="model folder whose processor prepares the inputs ('none': decode only)")
    parser.add_argument("--batches", type=int, default=50, help="batches walked per run")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per batch (train.batch_prompts)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the world and the walk")
    parser.add_argument("--child", metavar="SHARDS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train_images < 1 or args.batches < 1 or args.batch_size < 1 or min(args.scales) < 1:
        parser.error("--train-images, --scales, --batches and --batch-size must be >= 1")
    if args.model != "none" and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no model folder there (run `dvc repro base_model`, or pass --model none)")
    if args.child:
        print(json.dumps(child(args.child, args.reader[0], args.model, args.batches, args.batch_size, args.seed)))
        return 0
    print(json.dumps(run(args.train_images, args.scales, args.reader, args.model, args.batches, args.batch_size,
                         args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
