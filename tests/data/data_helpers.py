"""Helpers of the data tests: tiny world params and a hand-made raw layout builder."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from vlmgym.data import layout
from vlmgym.envs.geospot.settings import GeospotDataParams
from vlmgym.params import DataParams

TINY_GEO = GeospotDataParams(num_countries=3, cities_per_country=4)
TINY_WORLD = DataParams(train_images=60, test_images=24, ood_images=12, image_width=96, image_height=72, seed=3,
                        sections={"geospot": TINY_GEO})



def jpeg_bytes(width: int = 40, height: int = 30, seed: int = 0) -> bytes:
    """A small valid JPEG with random content."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def osv5m_row(image_id: str, lat: str, lon: str, country: str = "FR", region: str = "Bretagne",
              sub_region: str = "Finistere", city: str = "Brest") -> list[str]:
    """A 32-column OSV-5M row with the given fields, others empty."""
    values = {"id": image_id, "latitude": lat, "longitude": lon, "country": country, "region": region,
              "sub-region": sub_region, "city": city}
    return [values.get(c, "") for c in layout.OSV5M_COLUMNS]


def make_raw(raw_dir: Path, rows: dict[str, list[list[str]]], members: dict[str, list[tuple[str, bytes]]],
             header: tuple[str, ...] = layout.OSV5M_COLUMNS) -> Path:
    """Write a raw layout by hand: per split the CSV rows and the members of one zip, 00.zip."""
    for split in layout.SPLITS:
        layout.write_csv(layout.csv_path(raw_dir, split), header, rows.get(split, []))
        layout.write_zip(layout.zip_dir(raw_dir, split) / "00.zip", members.get(split, []))
    return raw_dir
