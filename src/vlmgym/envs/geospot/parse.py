"""A forgiving parser for geospot answers: five keyed lines, or an inline 'city, region, country, lat, lon'.

It never raises. It accepts key aliases (state, province, lat, lng, lon, long, coordinates), bullets, numbering,
markdown bold and tables, JSON-ish quotes, several fields on one line, commas as decimal separators, N/S/E/W
hemispheres (letters or words, before or after the number), degree signs and degrees-minutes-seconds.
Country/region/city values stay strings here; the gazetteer resolves them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

FIELDS = ("country", "region", "city", "latitude", "longitude")
MAX_ANSWER_CHARS = 8000  # answers are bounded by the sampler's max tokens; this only bounds regex work

_KEY_ALIASES = {
    "country": ("country", "nation", "country name"),
    "region": ("region", "state", "province", "state province", "state or province", "region state",
               "province state", "admin1", "admin 1", "prefecture", "oblast", "region province"),
    "city": ("city", "town", "city town", "village", "locality", "municipality", "nearest city", "city name",
             "closest city"),
    "latitude": ("latitude", "lat"),
    "longitude": ("longitude", "lon", "lng", "long"),
    "coordinates": ("coordinates", "coordinate", "coords", "gps", "gps coordinates", "lat lon", "lat long",
                    "lat lng", "latitude longitude", "latlon", "latlng", "location coordinates"),
}
_KEYS = {alias: field for field, aliases in _KEY_ALIASES.items() for alias in aliases}
_KEY_PATTERN = "|".join(sorted((re.escape(a).replace(r"\ ", r"[\s/_-]*") for a in _KEYS), key=len, reverse=True))

_LINE = re.compile(
    r"""^[\s>#*+\-•·|{\["'`_]*(?:\d{1,2}[.)]\s+)?[\s*_"'`]*"""  # bullets, numbering, markdown, quotes
    r"""(?P<key>[A-Za-z][A-Za-z0-9 /_&-]{0,40}?)[\s*_"'`\]]*(?:\([^)]*\))?[\s*_"'`]*"""
    r"""(?:[:=：]|\s[-–—]\s)\s*(?P<value>.*)$"""
)
# several fields on one line: "Latitude: 48.8, Longitude: 2.3" -> split before each known key
_FIELD_SPLIT = re.compile(rf"""[,;|]\s*(?=[*_"'`]*(?:{_KEY_PATTERN})[*_"'`\s]*(?:\([^)]*\))?[*_"'`\s]*[:=：])""", re.I)
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S | re.I)
_HEMISPHERE = r"(?:north|south|east|west|[nsew])"
_NUMBER = r"[+\-−]?\d+(?:[.,]\d+)?(?:[eE][+\-]?\d+)?"
_COORD = re.compile(
    rf"""(?<![A-Za-z0-9.])(?:(?P<pre>{_HEMISPHERE})\s*)?(?P<deg>{_NUMBER})\s*(?:°|º|˚|deg(?:rees?)?(?![A-Za-z]))?\s*"""
    r"""(?:(?P<min>\d+(?:[.,]\d+)?)\s*['′’]\s*(?:(?P<sec>\d+(?:[.,]\d+)?)\s*(?:"|″|”|''|′′)\s*)?)?"""
    rf"""(?P<post>{_HEMISPHERE}(?![A-Za-z0-9]))?""",
    re.I,
)
# "None" and "Nan" are not here: they are real places (None, Piedmont; Nan, Thailand)
EMPTY_VALUES = {"", "unknown", "n/a", "-", "--", "?", "null", "not sure", "unsure", "tbd"}
_TRIM = " \t*_`\"'.,;:[](){}<>"
_NAME_CHAR = re.compile(r"[^\W_]")


@dataclass(frozen=True)
class Coordinate:
    """One number read from text, with the axis its hemisphere letter implies (None without a letter)."""

    value: float
    axis: str | None


@dataclass(frozen=True)
class ParsedAnswer:
    """What a geospot answer says; None where a field is missing or unreadable."""

    country: str | None = None
    region: str | None = None
    city: str | None = None
    latitude: float | None = None
    longitude: float | None = None
    keyed_fields: tuple[str, ...] = ()  # fields read from "Key: value" lines
    inline: bool = False  # read by the 'city, region, country, lat, lon' fallback
    failures: tuple[str, ...] = ()

    @property
    def coordinates(self) -> tuple[float, float] | None:
        """(lat, lon) when both were read, else None."""
        if self.latitude is None or self.longitude is None:
            return None
        return self.latitude, self.longitude

    @property
    def format_ok(self) -> bool:
        """All five keys on their own lines and both coordinates readable (an empty name is content, not format)."""
        return (set(FIELDS) <= set(self.keyed_fields) and self.coordinates is not None
                and not any(f.startswith(("latitude", "longitude", "coordinates")) for f in self.failures))


def parse_answer(text: str) -> ParsedAnswer:
    """Read a geospot answer; never raises (a non-string reads as an empty answer)."""
    if not isinstance(text, str):
        text = ""
    text = text[:MAX_ANSWER_CHARS]
    answer = _ANSWER.search(text)
    text = answer.group(1) if answer else _THINK.sub(" ", text)
    values: dict[str, str] = {}
    for line in text.splitlines():
        for segment in _FIELD_SPLIT.split(line):
            key, value = _keyed(segment)
            if key is not None and key not in values:
                values[key] = value
    if values:
        return _from_keyed(values)
    inline = _inline(text)
    if inline is not None:
        return inline
    return ParsedAnswer(failures=tuple(f"{f}: missing" for f in FIELDS))


def _keyed(segment: str) -> tuple[str | None, str]:
    segment = segment.strip()
    if segment.count("|") >= 2:  # markdown table row: | Country | France |
        cells = [c.strip() for c in segment.strip("|").split("|")]
        if len(cells) >= 2 and _field_of(cells[0]) is not None:
            return _field_of(cells[0]), cells[1]
    match = _LINE.match(segment)
    if match is None:
        return None, ""
    return _field_of(match.group("key")), match.group("value")


def _field_of(key: str) -> str | None:
    return _KEYS.get(" ".join(re.findall(r"[a-z0-9]+", key.lower())))


def _clean_name(value: str) -> str | None:
    value = value.strip(_TRIM).strip()
    # a value without one letter or digit ('💩', '!!!', '—') names no place: it is missing, not unresolved
    return None if value.casefold() in EMPTY_VALUES or not _NAME_CHAR.search(value) else value


def _from_keyed(values: dict[str, str]) -> ParsedAnswer:
    failures: list[str] = []
    names = {f: _clean_name(values[f]) if f in values else None for f in ("country", "region", "city")}
    lat = lon = None
    lat_tokens = scan_coordinates(values["latitude"]) if "latitude" in values else []
    lon_tokens = scan_coordinates(values["longitude"]) if "longitude" in values else []
    if "latitude" in values:
        lat = _pick(lat_tokens, "lat", "latitude", failures)
    if "longitude" in values:
        lon = _pick(lon_tokens, "lon", "longitude", failures)
    elif len(lat_tokens) >= 2:  # "Latitude: 48.85, 2.35" with no longitude line
        lon = _pick(lat_tokens[1:], "lon", "longitude", failures)
    if "coordinates" in values and (lat is None or lon is None):
        pair = _pair(scan_coordinates(values["coordinates"]), failures)
        if pair is not None:
            lat, lon = (pair[0] if lat is None else lat), (pair[1] if lon is None else lon)
    failures += [f"{f}: missing" for f, value in names.items() if value is None]
    for f, value in (("latitude", lat), ("longitude", lon)):
        if value is None and not any(x.startswith(f) for x in failures):  # say why once, not twice
            failures.append(f"{f}: missing")
    keyed = tuple(f for f in FIELDS if f in values)
    return ParsedAnswer(names["country"], names["region"], names["city"], lat, lon, keyed, False,
                        tuple(failures))


def _inline(text: str) -> ParsedAnswer | None:
    tokens = list(_scan_with_spans(text))
    coords = None
    prefix = text
    failures: list[str] = []
    if len(tokens) >= 2:
        coords = _pair([t for t, _ in tokens[-2:]], failures)
        prefix = text[: tokens[-2][1]]
    parts = [p for p in (_clean_name(p) for p in re.split(r"[,;|\n]", prefix)) if p and re.search(r"[^\W\d_]", p)]
    if coords is None and len(parts) < 2:
        return None
    names: dict[str, str | None] = {"country": None, "region": None, "city": None}
    if len(parts) >= 3:
        names["city"], names["region"], names["country"] = parts[-3:]
    elif len(parts) == 2:
        names["city"], names["country"] = parts
    elif parts:
        names["country"] = parts[0]
    lat, lon = coords if coords is not None else (None, None)
    failures += [f"{f}: missing" for f in ("country", "region", "city") if names[f] is None]
    if coords is None:
        failures += ["latitude: missing", "longitude: missing"]
    return ParsedAnswer(names["country"], names["region"], names["city"], lat, lon, (), True, tuple(failures))


def scan_coordinates(text: str) -> list[Coordinate]:
    """Every coordinate-like number in `text`, in order (invalid minutes/seconds dropped)."""
    return [c for c, _ in _scan_with_spans(text)]


def _scan_with_spans(text: str):
    pos = 0
    while True:
        match = _COORD.search(text, pos)
        if match is None:
            return
        pre, post = match.group("pre"), match.group("post")
        pos = match.end()
        if pre and post:  # "N 48.8 E 2.3": the trailing letter belongs to the next number
            pos = match.start("post")
            post = None
        coordinate = _to_coordinate(match, (pre or post or "")[:1].upper())
        if coordinate is not None:
            yield coordinate, match.start()


def _to_coordinate(match: re.Match, hemisphere: str) -> Coordinate | None:
    try:
        degrees = float(match.group("deg").replace("−", "-").replace(",", "."))
        minutes = float(match.group("min").replace(",", ".")) if match.group("min") else 0.0
        seconds = float(match.group("sec").replace(",", ".")) if match.group("sec") else 0.0
    except (OverflowError, ValueError):
        return None
    if minutes >= 60 or seconds >= 60:
        return None
    value = abs(degrees) + minutes / 60 + seconds / 3600
    negative = hemisphere in ("S", "W") if hemisphere else degrees < 0 or match.group("deg").startswith(("-", "−"))
    axis = {"N": "lat", "S": "lat", "E": "lon", "W": "lon"}.get(hemisphere)
    return Coordinate(-value if negative else value, axis)


def _valid(value: float, axis: str) -> bool:
    limit = 90.0 if axis == "lat" else 180.0
    return math.isfinite(value) and -limit <= value <= limit


def _pick(tokens: list[Coordinate], axis: str, field: str, failures: list[str]) -> float | None:
    if not tokens:
        failures.append(f"{field}: no number")
        return None
    token = tokens[0]
    if token.axis not in (None, axis):
        failures.append(f"{field}: hemisphere of the other axis")
        return None
    if not _valid(token.value, axis):
        failures.append(f"{field}: out of range")
        return None
    return token.value


def _pair(tokens: list[Coordinate], failures: list[str]) -> tuple[float, float] | None:
    """(lat, lon) from two numbers, ordered by their hemisphere letters when they have them."""
    if len(tokens) < 2:
        failures.append("coordinates: fewer than two numbers")
        return None
    first, second = tokens[0], tokens[1]
    if first.axis == "lon" or second.axis == "lat":
        first, second = second, first
    if first.axis == "lon" or second.axis == "lat":
        failures.append("coordinates: both numbers on one axis")
        return None
    if not (_valid(first.value, "lat") and _valid(second.value, "lon")):
        failures.append("coordinates: out of range")
        return None
    return first.value, second.value
