"""Normalisation of place names and the country names/codes/aliases table (pycountry + common aliases)."""

from __future__ import annotations

import re
import unicodedata
from functools import cache

import pycountry

# Letters NFKD does not decompose into ASCII; GeoNames' ASCII names spell them like this.
_TRANSLIT = str.maketrans({"æ": "ae", "ø": "o", "œ": "oe", "ł": "l", "đ": "d", "ð": "d", "þ": "th", "ı": "i",
                           "ß": "ss", "ħ": "h", "ŀ": "l"})
# Apostrophes vanish (Cote d'Ivoire == Cote dIvoire; GeoNames writes Oblast' with one); other punctuation splits.
_APOSTROPHES = re.compile(r"['’`´ʼ]")
_TOKEN = re.compile(r"[^\W_]+")
_ABBREVIATIONS = {"st": "saint", "ste": "sainte", "mt": "mount", "ft": "fort"}
# Words that name the kind of an administrative area rather than the area ("State of Sao Paulo", "Tver Oblast").
GENERIC_AREA_WORDS = frozenset({
    "state", "of", "the", "province", "provincia", "provincie", "region", "regione", "oblast", "krai", "kray",
    "county", "prefecture", "governorate", "department", "departement", "departamento", "district", "voivodeship",
    "municipality", "canton", "territory", "autonomous", "okrug", "republic", "emirate", "division", "parish",
    "estado", "land", "bundesland", "wilaya", "muhafazah", "ken", "sheng", "de", "del", "da", "do", "des", "du",
})


def name_tokens(text: str) -> list[str]:
    """Lower-case ASCII-folded word tokens of a name (accents and punctuation removed, St. -> saint)."""
    if not text.isascii():
        text = unicodedata.normalize("NFKD", text.casefold().translate(_TRANSLIT))
        text = "".join(ch for ch in text if not unicodedata.combining(ch))
    tokens = _TOKEN.findall(_APOSTROPHES.sub("", text.lower()))
    return [_ABBREVIATIONS.get(t, t) for t in tokens]


def name_key(text: str) -> str:
    """The lookup key of a name: its tokens joined without spaces (so 'Saint-Etienne' == 'Saint Etienne').

    Text with no letter or digit ('💩', '!!!', '—') has the empty key, which names nothing: every lookup refuses it.
    """
    if text.isascii() and text.isalnum():  # one plain word, three names in four: the same key, half the time
        word = text.lower()
        return _ABBREVIATIONS.get(word, word)
    return "".join(name_tokens(text))


def area_key(text: str) -> str:
    """The key of an area name without generic words ('Province of Buenos Aires' -> 'buenosaires')."""
    tokens = name_tokens(text)
    kept = [t for t in tokens if t not in GENERIC_AREA_WORDS]
    return "".join(kept or tokens)


def strip_parenthetical(text: str) -> str:
    """Drop '(...)' asides: 'France (FR)' -> 'France'."""
    return re.sub(r"\([^)]*\)", " ", text).strip()


# Names people and models write for countries that pycountry does not list (highest priority when resolving).
COUNTRY_ALIASES: dict[str, str] = {
    "usa": "US", "us": "US", "u s a": "US", "america": "US", "united states of america": "US", "the states": "US",
    "uk": "GB", "u k": "GB", "britain": "GB", "great britain": "GB", "england": "GB", "scotland": "GB",
    "wales": "GB", "northern ireland": "GB", "united kingdom": "GB",
    "holland": "NL", "the netherlands": "NL", "nederland": "NL",
    "czechia": "CZ", "czech republic": "CZ", "czech": "CZ",
    "ivory coast": "CI", "cote d ivoire": "CI",
    "south korea": "KR", "korea": "KR", "republic of korea": "KR", "north korea": "KP",
    "russia": "RU", "iran": "IR", "syria": "SY", "laos": "LA", "vietnam": "VN", "bolivia": "BO",
    "venezuela": "VE", "tanzania": "TZ", "moldova": "MD", "taiwan": "TW", "palestine": "PS", "vatican": "VA",
    "vatican city": "VA", "holy see": "VA", "burma": "MM", "swaziland": "SZ", "cape verde": "CV",
    "east timor": "TL", "brunei": "BN", "uae": "AE", "emirates": "AE", "macedonia": "MK",
    "dr congo": "CD", "drc": "CD", "democratic republic of the congo": "CD", "congo kinshasa": "CD",
    "republic of the congo": "CG", "congo brazzaville": "CG", "turkey": "TR", "micronesia": "FM",
    "bosnia": "BA", "kosovo": "XK", "xk": "XK", "xkx": "XK", "nmb": "NA", "deutschland": "DE", "espana": "ES",
    "italia": "IT", "brasil": "BR", "mexico": "MX", "nippon": "JP", "suisse": "CH", "schweiz": "CH",
    "osterreich": "AT", "polska": "PL", "sverige": "SE", "norge": "NO", "danmark": "DK", "suomi": "FI",
    "hellas": "GR", "the philippines": "PH", "the gambia": "GM", "gambia": "GM", "the bahamas": "BS",
    "bahamas": "BS", "falklands": "FK", "falkland islands": "FK", "saint helena": "SH", "reunion": "RE",
    "curacao": "CW", "sint maarten": "SX", "saint martin": "MF", "us virgin islands": "VI",
    "british virgin islands": "VG", "cocos islands": "CC", "pitcairn islands": "PN",
}

# English or native names of big cities that the table spells differently (it keeps one ASCII name per place).
CITY_ALIASES: dict[str, tuple[str, ...]] = {
    "milan": ("Milano",), "naples": ("Napoli",), "venezia": ("Venice",), "torino": ("Turin",),
    "cologne": ("Koeln",), "koln": ("Koeln",), "nuremberg": ("Nuernberg",), "nurnberg": ("Nuernberg",),
    "geneva": ("Geneve",), "genf": ("Geneve",), "kyiv": ("Kiev",), "antwerp": ("Antwerpen",), "ghent": ("Gent",),
    "seville": ("Sevilla",), "bruxelles": ("Brussels",), "brussel": ("Brussels",), "praha": ("Prague",),
    "wien": ("Vienna",), "kobenhavn": ("Copenhagen",), "new york": ("New York City",), "nyc": ("New York City",),
    "washington dc": ("Washington, D.C.",), "roma": ("Rome",), "lisboa": ("Lisbon",), "munchen": ("Munich",),
    "moskva": ("Moscow",), "bombay": ("Mumbai",), "calcutta": ("Kolkata",), "peking": ("Beijing",),
    "saigon": ("Ho Chi Minh City",), "firenze": ("Florence",), "den haag": ("The Hague",),
    "s gravenhage": ("The Hague",), "beograd": ("Belgrade",), "frankfurt": ("Frankfurt am Main",),
    "hanover": ("Hannover",), "warszawa": ("Warsaw",), "bogota dc": ("Bogota",),
}


def city_alias_keys(text: str) -> tuple[str, ...]:
    """Lookup keys of the table's spellings of a city exonym ('Milan' -> ('milano',)); empty if none."""
    return tuple(name_key(n) for n in _city_alias_table().get(name_key(text), ()))


@cache
def _city_alias_table() -> dict[str, tuple[str, ...]]:
    return {name_key(alias): names for alias, names in CITY_ALIASES.items()}


# Short, familiar names for the ideal answer where pycountry's name is formal or inverted ("Korea, Republic of").
_DISPLAY_OVERRIDES: dict[str, str] = {
    "RU": "Russia", "CD": "DR Congo", "CG": "Republic of the Congo", "PS": "Palestine", "VA": "Vatican City",
    "FM": "Micronesia", "BN": "Brunei", "FK": "Falkland Islands", "SH": "Saint Helena", "XK": "Kosovo",
    "VG": "British Virgin Islands", "VI": "US Virgin Islands", "MF": "Saint Martin", "SX": "Sint Maarten",
    "CC": "Cocos Islands", "BQ": "Caribbean Netherlands", "TR": "Turkey", "GB": "United Kingdom",
    "US": "United States",
}


def country_display_name(code: str) -> str:
    """A short English name of an ISO-2 country code ('KR' -> 'South Korea'); the code itself if unknown."""
    if code in _DISPLAY_OVERRIDES:
        return _DISPLAY_OVERRIDES[code]
    country = pycountry.countries.get(alpha_2=code)
    if country is None:
        return code
    return getattr(country, "common_name", None) or country.name


@cache
def country_keys() -> dict[str, str]:
    """Lookup key -> ISO-2 code for codes, names, official/common names and aliases of every country."""
    keys: dict[str, str] = {}
    for alias, code in COUNTRY_ALIASES.items():
        keys.setdefault(name_key(alias), code)
    derived: list[tuple[str, str]] = []
    for country in pycountry.countries:
        code = country.alpha_2
        names = [code, country.alpha_3, country.name, getattr(country, "common_name", None),
                 getattr(country, "official_name", None), country_display_name(code)]
        for name in filter(None, names):
            keys.setdefault(name_key(name), code)
            # "Korea, Republic of" -> also "Republic of Korea" and "Korea" (only if nothing else claims it)
            if ", " in name:
                head, tail = name.split(", ", 1)
                derived += [(f"{tail} {head}", code), (head, code)]
            if "(" in name:
                derived.append((strip_parenthetical(name), code))
    for name, code in derived:
        keys.setdefault(name_key(name), code)
    keys.setdefault("xk", "XK")
    return keys


def lookup_country(text: str) -> str | None:
    """ISO-2 code named by `text` (code, name or alias; case, accents and punctuation ignored), else None."""
    keys = country_keys()
    for candidate in (text, strip_parenthetical(text)):
        key = name_key(candidate)
        if not key:
            continue
        if key in keys:
            return keys[key]
        tokens = name_tokens(candidate)
        if tokens and tokens[0] == "the" and "".join(tokens[1:]) in keys:
            return keys["".join(tokens[1:])]
    return None
