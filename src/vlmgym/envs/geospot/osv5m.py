"""OpenStreetView-5M from the Hugging Face hub, into the raw layout (a partial download works).

Files are fetched one by one into a cache folder (data.hub_cache_dir) that
survives interrupted runs: a file recorded as complete there with its size is
never fetched again. The raw layout is then built from the cache: the zips as
they are, and each split CSV keeping only the rows whose `{id}.jpg` is in one
of the downloaded zips (the others are dropped and counted).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from vlmgym.config.sections import DataParams
from vlmgym.data import layout
from vlmgym.runtime.atomic import atomic_file

DEFAULT_REPO = "osv5m/osv5m"
COMPLETE_RECORD = "complete.json"

# fetch(repo_id, filename, local_dir) -> path of the file, at local_dir / filename.
Fetch = Callable[[str, str, Path], Path]


def hub_fetch(repo_id: str, filename: str, local_dir: Path) -> Path:
    """Download one file of a hub dataset repo to local_dir/filename (the only network call of this module)."""
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id=repo_id, filename=filename, repo_type="dataset", local_dir=local_dir))


def wanted_files(zips_per_split: int) -> list[str]:
    """Hub paths to download: both split CSVs and the first zips of each split (test has only 5)."""
    files = [f"{split}.csv" for split in layout.SPLITS]
    hub_zip_counts = {"train": 98, "test": 5}
    for split in layout.SPLITS:
        files += [f"images/{split}/{layout.zip_name(k)}" for k in range(min(zips_per_split, hub_zip_counts[split]))]
    return files


def _check_fetched(path: Path, filename: str) -> None:
    if filename.endswith(".zip"):
        try:
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (zipfile.BadZipFile, OSError) as err:
            path.unlink(missing_ok=True)
            raise RuntimeError(f"{filename}: downloaded file is not a readable zip ({err}); removed, rerun to "
                               "fetch it again") from err
    else:
        layout.read_header(path)


def fetch_all(repo_id: str, files: list[str], cache_dir: Path, fetch: Fetch) -> dict[str, int]:
    """Fetch each file not yet complete in cache_dir; returns {filename: bytes} of the complete files."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    record_path = cache_dir / COMPLETE_RECORD
    complete = json.loads(record_path.read_text()) if record_path.exists() else {}
    for filename in tqdm(files, desc="hub download", unit="file"):
        local = cache_dir / filename
        if complete.get(filename) is not None and local.exists() and local.stat().st_size == complete[filename]:
            continue
        got = Path(fetch(repo_id, filename, cache_dir))
        if got.resolve() != local.resolve():
            raise RuntimeError(f"{filename}: fetch wrote {got}, expected {local}")
        _check_fetched(local, filename)
        complete[filename] = local.stat().st_size
        with atomic_file(record_path) as tmp:
            tmp.write_text(json.dumps(complete, indent=1, sort_keys=True))
    return {f: complete[f] for f in files}


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # the cache keeps its copy for the next run at no extra space
    except OSError:
        shutil.copyfile(src, dst)


def filter_csv(src: Path, dst: Path, present: layout.ZipIndex) -> dict[str, int]:
    """Copy the rows of `src` whose image is in `present` to `dst`; count kept and dropped rows."""
    header = layout.read_header(src)
    if "id" not in header:
        raise layout.RawLayoutError(f"{src}: no 'id' column in the header {header[:5]}...")
    id_column = header.index("id")
    counts = {"kept": 0, "image_missing": 0, "malformed_row": 0}
    # Streamed: the full train CSV is 2.9 GB.
    with atomic_file(dst) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        for _, _, fields in layout.iter_csv(src):
            if len(fields) != len(header):
                counts["malformed_row"] += 1
            elif f"{fields[id_column]}.jpg" in present:
                counts["kept"] += 1
                writer.writerow(fields)
            else:
                counts["image_missing"] += 1
    return counts


def download_hub_raw(params: DataParams, out_dir: Path, fetch: Fetch = hub_fetch) -> dict:
    """Download CSVs + data.zips_per_split zips per split and write the raw layout into out_dir."""
    repo_id = params.hub_repo or DEFAULT_REPO
    cache_dir = Path(params.hub_cache_dir)
    files = wanted_files(params.zips_per_split)
    sizes = fetch_all(repo_id, files, cache_dir, fetch)
    stats: dict = {"repo": repo_id, "downloaded_bytes": sum(sizes.values())}
    for split in layout.SPLITS:
        zips = [f for f in files if f.startswith(f"images/{split}/")]
        for name in zips:
            _link_or_copy(cache_dir / name, Path(out_dir) / name)
        present = layout.ZipIndex.build([cache_dir / name for name in zips])
        counts = filter_csv(cache_dir / f"{split}.csv", layout.csv_path(out_dir, split), present)
        stats[split] = {"rows": counts["kept"], "images": len(present.members), "zips": len(zips),
                        "dropped_image_missing": counts["image_missing"],
                        "dropped_malformed_row": counts["malformed_row"],
                        "unsafe_zip_members": present.unsafe_members}
    return stats
