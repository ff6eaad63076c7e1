"""geospot's params: its own section env.geospot (reward, report) and data.geospot (the synthetic world)."""

from __future__ import annotations

from dataclasses import dataclass

from vlmgym.config.spec import ParamsError, spec
from vlmgym.envs.think import ThinkParams


@dataclass(frozen=True)
class GeospotDataParams:
    """geospot's synthetic world: real GeoNames places in a few countries, rendered as street scenes."""

    countries: list[str] = spec(default_factory=list, doc="ISO-2 codes of the synthetic world (empty: num_countries)")
    num_countries: int = spec(8, ge=1, le=250, doc="countries picked when `countries` is empty")
    cities_per_country: int = spec(12, ge=1, le=500, doc="anchor places per country of the synthetic world")
    jitter_km: float = spec(2.0, gt=0, le=50, doc="std-dev of the synthetic coordinates around their anchor place")
    ood_shift: str = spec("fog", choices=("fog", "night"),
                          doc="rendering of the out-of-distribution split (data.ood_images): weather or time of day "
                              "that train never shows")
    ood_strength: float = spec(0.5, gt=0, le=1,
                               doc="how strong the shift is: fog's veil or night's darkening scaled by this (1: fog "
                                   "leaves half the contrast in the foreground, a fifth at the horizon; at 0.5 the "
                                   "SFT policy stays above the image-blind floor); lower is milder")


@dataclass(frozen=True)
class GeospotParams(ThinkParams):
    """geospot reward and report: k = exp(-d / tau) per level (country, region, city, coordinates), weighted."""

    tau_km: list[float] = spec(default_factory=lambda: [2000.0, 500.0, 100.0, 25.0], gt=0,
                               doc="distance scale (km) of the country, region, city and coordinates levels")
    tau_end_factor: float = spec(1.0, gt=0, le=1, doc="tau at progress 1 is tau_km * this (geometric in between); "
                                                      "1: no tightening")
    curriculum_progress: list[float] = spec(default_factory=lambda: [0.0, 0.25, 0.5, 0.75], ge=0, le=1,
                                            doc="training progress (step / total steps) of each curriculum stage")
    curriculum_weights: list[list[float]] = spec(
        default_factory=lambda: [[1.0, 0.2, 0.1, 0.1], [1.0, 0.6, 0.3, 0.3], [1.0, 1.0, 0.6, 0.6],
                                 [1.0, 1.0, 1.0, 1.0]],
        doc="level weights (country, region, city, coordinates) at each stage, linearly interpolated between")
    format_weight: float = spec(0.1, ge=0, le=1, doc="share of the reward given for the five-line answer format")
    answer_decimals: int = spec(4, ge=0, le=10, doc="decimals of the coordinates in the ideal (SFT target) answer")
    map_base_points: int = spec(4000, ge=0, doc="gazetteer places drawn as the report's world map base (0: none)")

    def __post_init__(self):
        where = "env.geospot"
        if len(self.tau_km) != 4:
            raise ParamsError(f"{where}.tau_km: expected 4 values (country, region, city, coordinates), "
                              f"got {self.tau_km!r}")
        points, weights = list(self.curriculum_progress), list(self.curriculum_weights)
        if not points or points[0] != 0.0 or any(b <= a for a, b in zip(points, points[1:])):
            raise ParamsError(f"{where}.curriculum_progress: must start at 0.0 and increase strictly, got {points!r}")
        if len(weights) != len(points):
            raise ParamsError(f"{where}.curriculum_weights: {len(weights)} stages for {len(points)} progress points")
        for i, row in enumerate(weights):
            if len(row) != 4 or any(w < 0 for w in row) or sum(row) <= 0:
                raise ParamsError(f"{where}.curriculum_weights[{i}]: expected 4 weights >= 0 with a positive sum, "
                                  f"got {row!r}")
