"""Geodesic (WGS84), haversine and GeoScore against known values, across the antimeridian and at the poles."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlmgym.geo import distance as geo

lats = st.floats(-90, 90, allow_nan=False)
lons = st.floats(-180, 180, allow_nan=False)


def test_geodesic_known_values():
    # GeographicLib's documented example, JFK -> LHR: 5551.759400319 km
    assert geo.geodesic_km(40.6, -73.8, 51.6, -0.5) == pytest.approx(5551.759400319, abs=1e-6)
    # one degree of longitude on the WGS84 equator: a * pi / 180
    assert geo.geodesic_km(0, 0, 0, 1) == pytest.approx(6378.137 * math.pi / 180, abs=1e-6)
    # pole to pole along a meridian: twice the quarter meridian, 10001.965729 km
    assert geo.geodesic_km(90, 0, -90, 0) == pytest.approx(2 * 10001.965729, abs=1e-5)


def test_antimeridian_and_poles():
    across = geo.geodesic_km(-17.0, 179.5, -17.0, -179.5)
    assert 100 < across < 110  # one degree of longitude at 17 S, not 359
    assert geo.geodesic_km(90, 0, 90, 123.0) == pytest.approx(0.0, abs=1e-9)  # longitude means nothing at a pole
    assert geo.geodesic_km(-90, -180, -90, 180) == pytest.approx(0.0, abs=1e-9)
    assert geo.geodesic_km(89.9, 0, 89.9, 180) == pytest.approx(22.35, abs=0.05)  # over the pole
    assert geo.haversine_km(0, 179.5, 0, -179.5) == pytest.approx(6371 * math.pi / 180, rel=1e-9)


def test_haversine_values_and_vectorisation():
    assert geo.haversine_km(0, 0, 0, 180) == pytest.approx(math.pi * 6371)
    assert isinstance(geo.haversine_km(1.0, 2.0, 3.0, 4.0), float)
    out = geo.haversine_km(np.zeros(3), np.zeros(3), np.zeros(3), np.array([0.0, 90.0, 180.0]))
    np.testing.assert_allclose(out, [0.0, math.pi / 2 * 6371, math.pi * 6371])


def test_geoscore_matches_the_osv5m_table():
    assert geo.geoscore(0.0) == 5000.0
    np.testing.assert_allclose(np.round(geo.geoscore(np.array([25, 200, 750, 2500]))), [4917, 4373, 3025, 937])


def test_geodesic_many_broadcasts_like_the_scalar():
    lat2 = np.array([[10.0, 20.0], [30.0, -40.0]])
    out = geo.geodesic_km_many(0.0, 0.0, lat2, 5.0)
    assert out.shape == (2, 2)
    for (i, j), value in np.ndenumerate(out):
        assert value == geo.geodesic_km(0.0, 0.0, float(lat2[i, j]), 5.0)


def test_spherical_mean_is_right_across_the_antimeridian():
    lat, lon = geo.spherical_mean([-17.0, -17.0], [179.0, -179.0])
    assert abs(lon) == pytest.approx(180.0, abs=1e-9)  # a mean of degrees would say 0 (the far side of the Earth)
    assert lat == pytest.approx(-17.0, abs=0.01)
    assert geo.spherical_mean([0, 0], [0, 180]) is None  # antipodes cancel: no mean


@settings(max_examples=150, deadline=None)
@given(lats, lons, lats, lons)
def test_geodesic_is_symmetric_and_close_to_haversine(lat1, lon1, lat2, lon2):
    d = geo.geodesic_km(lat1, lon1, lat2, lon2)
    assert d == pytest.approx(geo.geodesic_km(lat2, lon2, lat1, lon1), abs=1e-6)
    assert 0 <= d <= 20004.0
    # the ellipsoid and the 6371 km sphere differ by under 0.6 %
    assert abs(d - geo.haversine_km(lat1, lon1, lat2, lon2)) <= 0.006 * d + 1e-6
