"""The shard stage's library: validate raw rows, resize images, write webdataset tars plus a manifest.

One code path for every env; the env's RowSchema (vlmgym.data.rows) says which
columns its CSV needs, which images a row refers to and what goes into the
sample's json.
Output is deterministic (rows sorted by key, fixed tar headers), every tar is
written to a temp name and renamed, and the whole output folder is built beside
the old one and swapped in only when complete.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vlmgym.config.sections import ShardParams
from vlmgym.data import layout
from vlmgym.data.image_pool import ImagePool, available_cores
from vlmgym.data.rows import Row, RowSchema, RowSkip
from vlmgym.runtime.atomic import atomic_dir

log = logging.getLogger(__name__)

MAX_EXAMPLES = 5  # example rows per skip reason kept in the manifest


class ShardError(ValueError):
    """The raw data cannot be sharded at all (missing file, missing columns, nothing valid)."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


class _HashingFile:
    """A file being written whose bytes pass through sha256 on their way: the manifest's checksum of a tar costs no
    second read."""

    def __init__(self, path: Path):
        self._handle = path.open("wb")
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self._handle.write(data)

    def tell(self) -> int:
        return self._handle.tell()

    def close(self) -> None:
        self._handle.close()


class RollingTarWriter:
    """Writes samples into shard-NNNNNN.tar files of at most max_bytes (one sample may exceed it alone); each one's
    manifest entry holds its sha256, which the reader (vlmgym.data.shards) checks as it indexes the tar."""

    def __init__(self, out_dir: Path, max_bytes: int):
        self.out_dir, self.max_bytes = Path(out_dir), max_bytes
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.shards: list[dict] = []
        self._tar: tarfile.TarFile | None = None
        self._file: _HashingFile | None = None
        self._tmp: Path | None = None
        self._bytes = self._samples = 0

    def write(self, key: str, files: dict[str, bytes]) -> None:
        """Add one sample ({extension: bytes}) as consecutive tar members named key.extension."""
        size = sum(512 + -(-len(data) // 512) * 512 for data in files.values())
        if self._tar is not None and self._bytes + size > self.max_bytes:
            self._finish()
        if self._tar is None:
            self._tmp = self.out_dir / f".shard-{len(self.shards):06d}.tar.tmp"
            self._file = _HashingFile(self._tmp)
            # closed in _finish
            self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
            self._bytes = self._samples = 0
        for ext, data in files.items():
            # Fixed header fields: identical samples give identical tars, so DVC hashes are stable.
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o444
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tar.addfile(info, io.BytesIO(data))
        self._bytes += size
        self._samples += 1

    def _finish(self) -> None:
        assert self._tar is not None and self._file is not None and self._tmp is not None
        self._tar.close()  # a tar given a file object leaves closing it to the caller
        self._file.close()
        final = self.out_dir / f"shard-{len(self.shards):06d}.tar"
        os.replace(self._tmp, final)
        self.shards.append({"name": final.name, "samples": self._samples, "bytes": final.stat().st_size,
                            "sha256": self._file.digest.hexdigest()})
        self._tar = self._file = self._tmp = None

    def close(self) -> None:
        """Finish the open tar, if any."""
        if self._tar is not None:
            self._finish()

    def abort(self) -> None:
        """Drop the tar being written."""
        if self._tar is not None:
            self._tar.close()
            self._file.close()
            self._tmp.unlink(missing_ok=True)
            self._tar = self._file = self._tmp = None


def read_rows(raw_dir: Path, split: str, schema: RowSchema, index: layout.ZipIndex,
              skipped: Counter, examples: dict[str, list[str]]) -> list[Row]:
    """Validate a split's CSV rows (all values kept as strings); invalid rows are counted, not fatal."""
    path = layout.csv_path(raw_dir, split)
    if not path.exists():
        raise ShardError(f"{path}: missing; run the download stage first")
    header = layout.read_header(path)
    missing = [c for c in schema.required if c not in header]
    if missing:
        raise ShardError(f"{path}: header lacks column(s) {missing} needed by env {schema.name}")

    def skip(reason: str, where: str) -> None:
        skipped[reason] += 1
        if len(examples.setdefault(reason, [])) < MAX_EXAMPLES:
            examples[reason].append(where)

    rows, seen = [], set()
    for line, header, fields in layout.iter_csv(path):
        where = f"{path.name} line {line}"
        if len(fields) != len(header):
            skip("malformed_row", f"{where}: {len(fields)} fields, header has {len(header)}")
            continue
        try:
            row = schema.row(dict(zip(header, fields)))
        except RowSkip as err:
            skip(err.reason, f"{where}: {err}")
            continue
        if row.key in seen:
            skip("duplicate_id", f"{where}: key {row.key}")
            continue
        absent = [name for name in row.images if name not in index]
        if absent:
            skip("image_missing", f"{where}: {absent[0]} in no zip of images/{split}")
            continue
        seen.add(row.key)
        rows.append(row)
    return sorted(rows, key=lambda r: r.key)


def hold_out(rows: list[Row], count: int, key: str = "val_samples", share: int = 4) -> tuple[list[Row], list[Row]]:
    """(kept, held out): the `count` rows whose keys hash lowest (at most 1/`share` of them, so a small dataset
    still trains), so the choice depends on neither the CSV's order nor the other rows' keys beyond their rank;
    both lists keep the rows' order. `key` names the setting in the warning when `count` is cut."""
    if count > len(rows) // share:
        log.warning("shard.%s=%d is more than 1/%d of the %d valid train rows: holding out %d",
                    key, count, share, len(rows), len(rows) // share)
        count = len(rows) // share
    ranked = sorted(rows, key=lambda r: hashlib.sha256(r.key.encode()).hexdigest())
    held = {r.key for r in ranked[:count]}
    return [r for r in rows if r.key not in held], [r for r in rows if r.key in held]


def shard_splits(raw_dir: Path, split: str, schema: RowSchema, params: ShardParams,
                 out_dirs: dict[str, Path], pool: ImagePool | None = None) -> dict[str, dict]:
    """Write a raw split's tars: into out_dirs[split], and for train with `val_samples` (`rl_samples`) the held-out
    rows into out_dirs["val"] (out_dirs["rl"]: the next lowest hashes, so val is the same with or without it);
    returns each written split's manifest entry (the CSV's skips are counted on `split`). `pool` prepares the
    images (None: this process)."""
    index = layout.ZipIndex.build(layout.split_zips(raw_dir, split))
    skipped: Counter = Counter()
    examples: dict[str, list[str]] = {}
    rows = read_rows(raw_dir, split, schema, index, skipped, examples)
    parts = {split: rows}
    if "val" in out_dirs:
        parts[split], parts["val"] = hold_out(rows, params.val_samples)
    if "rl" in out_dirs:
        parts[split], parts["rl"] = hold_out(parts[split], params.rl_samples, key="rl_samples", share=2)
    caps = {"train": params.max_train, "test": params.max_test, "test_ood": params.max_test, "val": 0, "rl": 0}
    for held, key in (("val", "val_samples"), ("rl", "rl_samples")):
        if held in parts and not parts[held]:
            raise ShardError(f"{split}: {len(rows)} valid rows are too few to hold out a {held} split; "
                             f"set shard.{key}: 0")
    entries = {}
    for name in sorted(parts, reverse=True):  # val before train: the same reading order every time
        own_skips: Counter = skipped if name == split else Counter()
        own_examples = examples if name == split else {}
        entries[name] = _write_rows(parts[name], name, caps[name], index, schema, params, out_dirs[name],
                                    own_skips, own_examples, raw_dir, pool or ImagePool(1))
    return entries


def _write_rows(rows: list[Row], split: str, cap: int, index: layout.ZipIndex, schema: RowSchema,
                params: ShardParams, out_dir: Path, skipped: Counter, examples: dict[str, list[str]],
                raw_dir: Path, pool: ImagePool) -> dict:
    writer = RollingTarWriter(out_dir, params.shard_max_bytes)
    kept = 0
    tasks = ((tuple((str(index.members[name][0]), index.members[name][1]) for name in row.images),
              params.max_pixels, params.jpeg_quality) for row in rows)
    try:
        for row, (images, error) in tqdm(zip(rows, pool.prepared(tasks)), total=len(rows),
                                         desc=f"shard {split}", unit="sample"):
            if images is None:
                skipped["image_corrupt"] += 1
                if len(examples.setdefault("image_corrupt", [])) < MAX_EXAMPLES:
                    examples["image_corrupt"].append(f"{split} key {row.key}: {error}")
                continue
            files = dict(zip(schema.image_exts, images))
            files["json"] = json.dumps(row.meta, ensure_ascii=False, sort_keys=True).encode()
            writer.write(row.key, files)
            kept += 1
            if cap and kept >= cap:
                break
        writer.close()
    except BaseException:
        writer.abort()
        raise
    for reason, where in sorted(examples.items()):
        log.warning("%s %s: %d skipped, e.g. %s", split, reason, skipped[reason], where[0])
    if kept == 0:
        first = next(iter(examples.values()), ["no data rows"])[0]
        raise ShardError(f"{split}: no valid sample in {layout.csv_path(raw_dir, split)} "
                         f"(skipped: {dict(sorted(skipped.items()))}; e.g. {first})")
    return {"kept": kept, "capped": max(0, len(rows) - kept - skipped["image_corrupt"]),
            "skipped": dict(sorted(skipped.items())), "examples": {k: v for k, v in sorted(examples.items())},
            "zip_members": {"indexed": len(index.members), "unsafe": index.unsafe_members,
                            "oversized": index.oversized_members, "duplicate": index.duplicate_members},
            "shards": writer.shards}


def shard_raw(raw_dir: Path, out_dir: Path, schema: RowSchema, params: ShardParams) -> dict:
    """Shard every split of a raw layout (train, test, and test_ood where the generator wrote it; the val and rl
    splits held out of train) into out_dir (swapped in atomically) with manifest.json; returns it. The images are
    prepared by `params.workers` processes (0: one per available core)."""
    # `workers` changes how fast, not what: leaving it out keeps the manifest the same bytes for any count; so does
    # rl_samples at 0, so that shards written before it existed keep their bytes.
    settings = {k: v for k, v in asdict(params).items() if k != "workers" and (k != "rl_samples" or v)}
    manifest = {"dataset": schema.name, "params": settings, "splits": {}}
    workers = params.workers or available_cores()
    log.info("shard: preparing images with %d worker process%s", workers, "" if workers == 1 else "es")
    with atomic_dir(Path(out_dir)) as tmp, ImagePool(workers) as pool:
        for split in layout.present_splits(Path(raw_dir)):
            out_dirs = {split: tmp / split}
            if split == "train" and params.val_samples:
                out_dirs["val"] = tmp / "val"
            if split == "train" and params.rl_samples:
                out_dirs["rl"] = tmp / "rl"
            manifest["splits"].update(shard_splits(Path(raw_dir), split, schema, params, out_dirs, pool))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def shard_parts(raw_dir: Path, out_dir: Path, schemas: dict[str, RowSchema], params: ShardParams) -> dict:
    """Shard several envs' raw layouts (raw_dir/<name>/, see vlmgym.data.download.build_raw_parts) each into
    out_dir/<name>/ as shard_raw does, with a top manifest.json holding each one's; swapped in as one folder."""
    manifest = {"dataset": "+".join(schemas), "parts": {}}
    with atomic_dir(Path(out_dir)) as tmp:
        for name, schema in schemas.items():
            manifest["parts"][name] = shard_raw(Path(raw_dir) / name, tmp / name, schema, params)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def env_schemas(envs: dict[str, Any]) -> dict[str, RowSchema]:
    """{name: row schema} of the configured env's envs ({name: Env class}: vlmgym.envs.parts); a ValueError names
    an env that declares none, whose raw data cannot be sharded."""
    schemas = {}
    for name, env in envs.items():
        if env.schema is None:
            raise ValueError(f"env {env.name!r} declares no row schema, so its raw data cannot be sharded")
        schemas[name] = env.schema
    return schemas


def shard_envs(raw_dir: Path, out_dir: Path, schemas: dict[str, RowSchema], params: ShardParams) -> dict:
    """Shard the raw layout of the configured env's envs ({name: row schema}: env_schemas): one env's raw_dir into
    out_dir (shard_raw), or, for several (an env made of several), each raw_dir/<name>/ into out_dir/<name>/
    (shard_parts); returns the manifest."""
    if len(schemas) == 1:
        return shard_raw(raw_dir, out_dir, next(iter(schemas.values())), params)
    return shard_parts(raw_dir, out_dir, schemas, params)

def manifest_metrics(manifest: dict) -> dict[str, float]:
    """Kept / skipped-per-reason / shard counts as flat MLflow metrics (`<part>/...` per part of a manifest of
    several, see shard_parts)."""
    metrics: dict[str, float] = {}
    for name, part in manifest.get("parts", {}).items():
        metrics.update({f"{name}/{key}": value for key, value in manifest_metrics(part).items()})
    for split, entry in manifest.get("splits", {}).items():
        metrics[f"{split}.kept"] = entry["kept"]
        metrics[f"{split}.capped"] = entry["capped"]
        metrics[f"{split}.shards"] = len(entry["shards"])
        metrics[f"{split}.bytes"] = sum(s["bytes"] for s in entry["shards"])
        metrics[f"{split}.skipped_total"] = sum(entry["skipped"].values())
        for reason, count in entry["skipped"].items():
            metrics[f"{split}.skipped.{reason}"] = count
        metrics[f"{split}.zip_members_unsafe"] = entry["zip_members"]["unsafe"]
    return metrics
