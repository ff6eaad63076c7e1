"""geospot: where was this street-view photo taken? Five lines, coarse to fine, scored by geodesic distance.

The reward (see geospot_reward) is offline and deterministic; the answer parser (geospot_parse) is forgiving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.geospot_parse import parse_answer
from vlmgym.envs.geospot_reward import GeospotTruth, resolve_truth, score
from vlmgym.geo.gazetteer import gazetteer
from vlmgym.geo.names import country_display_name
from vlmgym.params import GeospotParams

# Short on purpose: a tiny model is trained on it. The keys are listed in the order the answer must give them.
PROMPT = "Where was this photo taken? Answer with five lines:\nCountry:\nRegion:\nCity:\nLatitude:\nLongitude:"
CORPUS_CITIES_PER_COUNTRY = 10


class GeospotEnv(Env):
    """OSV-5M-style geolocation from one image; samples are webdataset shards with OSV-5M labels in `.json`."""

    name = "geospot"

    def __init__(self, samples: Sequence[SampleLike] | None = None, *, shards_dir: str = "data/shards",
                 split: str = "train", limit: int | None = None, tokenizer: Any = None,
                 params: GeospotParams | None = None, progress: float = 0.0):
        """Serve samples (given, or read from the shards) and score answers with `params` (defaults if None)."""
        super().__init__(samples, shards_dir=shards_dir, split=split, limit=limit, tokenizer=tokenizer)
        for sample in self.samples:
            missing = [k for k in ("latitude", "longitude", "country") if k not in sample.meta]
            if len(sample.images) != 1 or missing:
                raise ValueError(f"geospot: sample {sample.key!r} has {len(sample.images)} images (expected 1) "
                                 f"and lacks meta keys {missing}")
        self.params = params if params is not None else GeospotParams()
        self.gazetteer = gazetteer()
        self.set_progress(progress)

    def prompt(self, sample: SampleLike) -> str:
        """The same question for every image."""
        return PROMPT

    def prepare_truth(self, sample: SampleLike) -> GeospotTruth:
        """Resolve the labels to places once per reset, not once per answer."""
        return resolve_truth(sample.meta, self.gazetteer)

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """Parse and score an answer at the env's current training progress."""
        truth = state.truth if state.truth is not None else resolve_truth(state.meta, self.gazetteer)
        return score(parse_answer(text), truth, self.params, self.progress, self.gazetteer)

    def ideal_answer(self, meta: dict, exact: bool = False) -> str:
        """The perfect five-line answer for a sample (the SFT target): coordinates to params.answer_decimals
        decimals, or as the exact floats with exact=True."""
        decimals = None if exact else self.params.answer_decimals
        return render_answer(country_display_name(str(meta.get("country", ""))), meta.get("region"),
                             meta.get("city"), float(meta["latitude"]), float(meta["longitude"]), decimals)

    @classmethod
    def corpus(cls, cities_per_country: int = CORPUS_CITIES_PER_COUNTRY) -> list[str]:
        """Prompt plus ideal answers covering every country, every region and a bounded sample of cities.

        One answer per admin1 region (at its representative place) and per country `cities_per_country` places
        spread evenly through the table: ~6k answers, ~0.5 MB, so a BPE tokenizer sees every country and region
        name and a broad sample of city names in the exact answer layout.
        """
        gaz = gazetteer()
        texts = [PROMPT]
        for cc in gaz.countries():
            country = country_display_name(cc)
            places = [gaz.region_point(cc, admin1) for admin1 in gaz.regions(cc)] or [gaz.country_point(cc)]
            indices = gaz.country_places[cc]
            take = np.unique(np.linspace(0, len(indices) - 1, min(cities_per_country, len(indices))).astype(int))
            places += [gaz.place(indices[i]) for i in take]
            texts += [render_answer(country, p.admin1, p.name, p.lat, p.lon, 4) for p in places]
        return texts


def render_answer(country: str, region: str | None, city: str | None, latitude: float, longitude: float,
                  decimals: int | None = 4) -> str:
    """Five lines in the prompt's order; an empty label leaves its value empty."""
    def number(x: float) -> str:
        return repr(float(x)) if decimals is None else f"{x:.{decimals}f}"

    if not (math.isfinite(latitude) and math.isfinite(longitude)):
        raise ValueError(f"geospot: cannot render coordinates ({latitude}, {longitude})")
    lines = [f"Country: {country}", f"Region: {region or ''}", f"City: {city or ''}",
             f"Latitude: {number(latitude)}", f"Longitude: {number(longitude)}"]
    return "\n".join(line.rstrip() for line in lines)

