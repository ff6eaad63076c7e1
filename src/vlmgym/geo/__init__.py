"""Offline geography: the GeoNames gazetteer (reverse + forward), geodesic/haversine distances, GeoScore."""

from vlmgym.geo.distance import (
    EARTH_RADIUS_KM,
    GEOSCORE_SCALE_KM,
    geodesic_km,
    geodesic_km_many,
    geoscore,
    haversine_km,
    spherical_mean,
)
from vlmgym.geo.gazetteer import Gazetteer, Place, gazetteer
from vlmgym.geo.names import country_display_name, lookup_country, name_key

__all__ = [
    "EARTH_RADIUS_KM",
    "GEOSCORE_SCALE_KM",
    "Gazetteer",
    "Place",
    "country_display_name",
    "gazetteer",
    "geodesic_km",
    "geodesic_km_many",
    "geoscore",
    "haversine_km",
    "lookup_country",
    "name_key",
    "spherical_mean",
]
