"""The geospot answer parser: every accepted format, and it never raises."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vlmgym.envs.geospot import render_answer
from vlmgym.envs.geospot.parse import EMPTY_VALUES, FIELDS, parse_answer, scan_coordinates

CANONICAL = "Country: France\nRegion: Ile-de-France\nCity: Paris\nLatitude: 48.8534\nLongitude: 2.3488"
PARIS = ("France", "Ile-de-France", "Paris", 48.8534, 2.3488)


def fields(parsed):
    return parsed.country, parsed.region, parsed.city, parsed.latitude, parsed.longitude


@pytest.mark.parametrize("text", [
    CANONICAL,
    "country: France\nregion: Ile-de-France\ncity: Paris\nlatitude: 48.8534\nlongitude: 2.3488",
    "**Country:** France\n**Region:** Ile-de-France\n**City:** Paris\n**Latitude:** 48.8534\n**Longitude:** 2.3488",
    "- Country: France\n- Region: Ile-de-France\n- City: Paris\n- Latitude: 48.8534\n- Longitude: 2.3488",
    "1. **Country**: France\n2. State: Ile-de-France\n3. Town: Paris\n4. Lat: 48.8534\n5. Lng: 2.3488",
    "Country - France\nProvince - Ile-de-France\nCity - Paris\nLat = 48.8534\nLon = 2.3488",
    "Country: France, Region: Ile-de-France, City: Paris, Latitude: 48.8534, Longitude: 2.3488",
    "| Field | Value |\n|---|---|\n| Country | France |\n| Region | Ile-de-France |\n| City | Paris |\n"
    "| Latitude | 48.8534 |\n| Longitude | 2.3488 |",
    '{"country": "France", "region": "Ile-de-France", "city": "Paris", "lat": 48.8534, "long": 2.3488}',
    "<think>Looks French. Country: Spain?</think>\n" + CANONICAL,
    "<answer>\n" + CANONICAL + "\n</answer>",
    "Country: France\nRegion: Ile-de-France\nCity: Paris\nLatitude: 48,8534\nLongitude: 2,3488",
    "Country: France\nRegion: Ile-de-France\nCity: Paris\nLatitude: 48.8534° N\nLongitude: 2.3488° E",
    "Country: France\nRegion: Ile-de-France\nCity: Paris\nLatitude: N 48.8534\nLongitude: E 2.3488",
    "Country: France\nRegion: Ile-de-France\nCity: Paris\nLatitude: 48.8534 north\nLongitude: 2.3488 East",
    "Country: France\nRegion: Ile-de-France\nCity: Paris\nCoordinates: 48.8534, 2.3488",
    "Country: France\nRegion: Ile-de-France\nCity: Paris\nGPS: 2.3488 E, 48.8534 N",
    "Paris, Ile-de-France, France, 48.8534, 2.3488",
    "Paris; Ile-de-France; France; 48,8534; 2,3488",
])
def test_formats_read_the_same_answer(text):
    got = fields(parse_answer(text))
    assert got[:3] == PARIS[:3]
    assert got[3] == pytest.approx(PARIS[3]) and got[4] == pytest.approx(PARIS[4])


@pytest.mark.parametrize(("text", "lat", "lon"), [
    ("Latitude: 33.87 S\nLongitude: 151.21 E", -33.87, 151.21),
    ("Latitude: -33.87\nLongitude: -151.21", -33.87, -151.21),
    ("Latitude: 33.87°S\nLongitude: 70.5°W", -33.87, -70.5),
    ("Latitude: −33.87\nLongitude: +70.5", -33.87, 70.5),  # a unicode minus
    ("Latitude: 48°51'24\"N\nLongitude: 2°21'7\"E", 48 + 51 / 60 + 24 / 3600, 2 + 21 / 60 + 7 / 3600),
    ("Latitude: 48° 51.4' N\nLongitude: 2° 21.1' W", 48 + 51.4 / 60, -(2 + 21.1 / 60)),
    ("Latitude: 48°51′24″S\nLongitude: 2°21′7″E", -(48 + 51 / 60 + 24 / 3600), 2 + 21 / 60 + 7 / 3600),
    ("Latitude: approximately 12.5\nLongitude: about -3", 12.5, -3.0),
    ("Latitude: 48.85, 2.35", 48.85, 2.35),  # both numbers on the latitude line
    ("Coordinates: 35.68 N, 139.69 E", 35.68, 139.69),
    ("Coordinates: 139.69 E, 35.68 N", 35.68, 139.69),  # ordered by the hemisphere letters
    ("Latitude: 90\nLongitude: -180", 90.0, -180.0),
])
def test_coordinates(text, lat, lon):
    parsed = parse_answer(text)
    assert parsed.latitude == pytest.approx(lat) and parsed.longitude == pytest.approx(lon)


@pytest.mark.parametrize(("text", "failure"), [
    ("Latitude: 91\nLongitude: 0", "latitude: out of range"),
    ("Latitude: 1e308\nLongitude: 0", "latitude: out of range"),
    ("Latitude: 0\nLongitude: 99999999999999999999999999", "longitude: out of range"),
    ("Latitude: 1e400\nLongitude: 0", "latitude: out of range"),
    ("Latitude: 12 E\nLongitude: 0", "latitude: hemisphere of the other axis"),
    ("Latitude: somewhere\nLongitude: 0", "latitude: no number"),
    ("Latitude: 48°75'N\nLongitude: 0", "latitude: no number"),  # 75 minutes is not a DMS angle
    ("Latitude: 0", "longitude: missing"),
])
def test_bad_coordinates_are_failures_not_values(text, failure):
    parsed = parse_answer(text)
    assert failure in parsed.failures
    assert parsed.coordinates is None
    assert not parsed.format_ok


def test_canonical_answer_is_format_ok_and_variants_are_not():
    assert parse_answer(CANONICAL).format_ok
    assert parse_answer(CANONICAL.replace("Country", "**Country**")).format_ok  # aliases and markdown are fine
    assert not parse_answer("Paris, Ile-de-France, France, 48.85, 2.35").format_ok  # inline fallback
    assert not parse_answer(CANONICAL.replace("City: Paris\n", "")).format_ok
    assert parse_answer(CANONICAL.replace("Region: Ile-de-France", "Region:")).format_ok  # truth may have none
    assert not parse_answer(CANONICAL.replace("2.3488", "east-ish")).format_ok


def test_unknown_values_and_namibia():
    parsed = parse_answer("Country: NA\nRegion: unknown\nCity: N/A\nLatitude: -22.56\nLongitude: 17.08")
    assert parsed.country == "NA"  # Namibia's code is not "not available"
    assert parsed.region is None and parsed.city is None
    assert "region: missing" in parsed.failures


@pytest.mark.parametrize("name", ["💩", "!!!", "—", "…", "?!", "🙂 🙂", "~~", "(*)"])
def test_a_name_without_a_letter_or_digit_is_missing(name):
    parsed = parse_answer(f"Country: {name}\nRegion: {name}\nCity: {name}\nLatitude: 35.2\nLongitude: 36.0")
    assert (parsed.country, parsed.region, parsed.city) == (None, None, None)
    assert {"country: missing", "region: missing", "city: missing"} <= set(parsed.failures)
    assert parsed.format_ok  # a missing name is content, not format
    assert parse_answer(f"City: {name}1").city and parse_answer(f"City: {name} Aş").city  # one is enough


def test_first_occurrence_of_a_field_wins_and_long_beach_stays_a_city():
    parsed = parse_answer("City: Long Beach, Long: -118.19, Lat: 33.77\nCity: Paris")
    assert (parsed.city, parsed.latitude, parsed.longitude) == ("Long Beach", 33.77, -118.19)


@pytest.mark.parametrize("text", ["", "   \n\n", "asdf", "I don't know.", "France", "🙂" * 50, "Country:",
                                  "Latitude:\nLongitude:", "1234", "x" * 100000])
def test_garbage_gives_no_fields(text):
    parsed = parse_answer(text)
    assert fields(parsed) == (None,) * 5 or parsed.country in ("France", None)
    assert not parsed.format_ok


def test_non_string_input_reads_as_empty():
    assert fields(parse_answer(None)) == (None,) * 5
    assert set(parse_answer(b"Country: France").failures) == {f"{f}: missing" for f in FIELDS}


def test_scan_handles_exponents_and_words():
    assert [c.value for c in scan_coordinates("1e3 and 2.5E")] == [1000.0, 2.5]
    assert [c.axis for c in scan_coordinates("2.5E 7 south")] == ["lon", "lat"]
    assert [c.value for c in scan_coordinates("A4 v2.0")] == []


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_never_raises(text):
    parsed = parse_answer(text)
    for value, limit in ((parsed.latitude, 90), (parsed.longitude, 180)):
        assert value is None or (math.isfinite(value) and abs(value) <= limit)


names = st.text(st.characters(whitelist_categories=("L",), whitelist_characters=" -'"), min_size=1, max_size=20)
names = names.filter(lambda s: s[0].isalpha() and s[-1].isalpha() and s.casefold() not in EMPTY_VALUES)


@settings(max_examples=200, deadline=None)
@given(names, names, names, st.floats(-90, 90), st.floats(-180, 180))
def test_rendered_answers_parse_back_exactly(country, region, city, lat, lon):
    parsed = parse_answer(render_answer(country, region, city, lat, lon, decimals=None))
    assert fields(parsed) == (country, region, city, lat, lon)
    assert parsed.format_ok
