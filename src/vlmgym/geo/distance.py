"""Distances on the Earth: geodesic (WGS84, for rewards), haversine and GeoScore (the OSV-5M metrics)."""

from __future__ import annotations

import math

import numpy as np
from geographiclib.geodesic import Geodesic

EARTH_RADIUS_KM = 6371.0  # the sphere the OSV-5M evaluation code uses for haversine
GEOSCORE_MAX = 5000.0
GEOSCORE_SCALE_KM = 1492.7  # GeoGuessr's constant, as in the OSV-5M metrics

_WGS84 = Geodesic.WGS84
_DISTANCE_ONLY = Geodesic.DISTANCE  # skip azimuths and reduced lengths: the reward needs only s12


def geodesic_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Shortest distance in km between two points on the WGS84 ellipsoid (Karney's algorithm)."""
    return _WGS84.Inverse(lat1, lon1, lat2, lon2, _DISTANCE_ONLY)["s12"] / 1000.0


def geodesic_km_many(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Element-wise geodesic distances in km for broadcastable arrays of coordinates."""
    # geographiclib has no array API; a plain loop costs ~30-50 us per pair, which is what rewards need.
    a, b, c, d = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (lat1, lon1, lat2, lon2)))
    out = np.empty(a.shape, dtype=np.float64)
    flat = out.reshape(-1)
    for i, args in enumerate(zip(a.reshape(-1), b.reshape(-1), c.reshape(-1), d.reshape(-1))):
        flat[i] = geodesic_km(*(float(x) for x in args))
    return out


def haversine_km(lat1, lon1, lat2, lon2) -> float | np.ndarray:
    """Great-circle distance in km on a sphere of radius 6371 km (vectorised; floats in, float out)."""
    lat1, lon1, lat2, lon2 = (np.radians(np.asarray(x, dtype=np.float64)) for x in (lat1, lon1, lat2, lon2))
    h = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    # clip: rounding can push h a hair above 1 for antipodal points
    d = 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))
    return float(d) if d.ndim == 0 else d


def geoscore(distance_km) -> float | np.ndarray:
    """GeoGuessr score of a distance: 5000 * exp(-d / 1492.7) (vectorised)."""
    s = GEOSCORE_MAX * np.exp(-np.asarray(distance_km, dtype=np.float64) / GEOSCORE_SCALE_KM)
    return float(s) if s.ndim == 0 else s


def to_unit_vectors(lat, lon) -> np.ndarray:
    """Points on the unit sphere, shape (..., 3), for averaging without a longitude seam."""
    lat, lon = np.radians(np.asarray(lat, dtype=np.float64)), np.radians(np.asarray(lon, dtype=np.float64))
    cos_lat = np.cos(lat)
    return np.stack([cos_lat * np.cos(lon), cos_lat * np.sin(lon), np.sin(lat)], axis=-1)


def from_unit_vector(vector) -> tuple[float, float]:
    """(lat, lon) in degrees of a non-zero 3-vector."""
    x, y, z = (float(v) for v in vector)
    return math.degrees(math.atan2(z, math.hypot(x, y))), math.degrees(math.atan2(y, x))


def spherical_mean(lat, lon) -> tuple[float, float] | None:
    """Mean of points as the normalised mean of unit vectors (right across the antimeridian); None if they cancel."""
    mean = to_unit_vectors(lat, lon).reshape(-1, 3).mean(axis=0)
    if np.linalg.norm(mean) < 1e-12:
        return None
    return from_unit_vector(mean)
