"""dvc.yaml's top-level plots: images a stage writes, so `dvc plots show` renders them offline (DVC embeds an image
as it is; a data plot's page loads vega from a CDN and stays blank without the network)."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import yaml

from vlmgym.eval.curve import CURVES_PNG
from vlmgym.tracking.step_curve import curve_file

REPO = Path(__file__).resolve().parents[2]
DVC = yaml.safe_load((REPO / "dvc.yaml").read_text())
# the image types DVC embeds (dvc_render's ImageRenderer)
IMAGES = {".png", ".jpg", ".jpeg", ".gif", ".svg"}


def plot_paths() -> list[str]:
    return [next(iter(entry)) if isinstance(entry, dict) else entry for entry in DVC["plots"]]


def stage_outs(spec: dict) -> list[str]:
    return [next(iter(out)) if isinstance(out, dict) else out
            for key in ("outs", "metrics", "plots") for out in spec.get(key, [])]


def test_every_plot_is_an_image():
    assert plot_paths()
    assert [p for p in plot_paths() if PurePosixPath(p).suffix.lower() not in IMAGES] == []


def test_every_plot_is_an_output_of_a_stage():
    def written_by(path: str) -> list[str]:
        return [stage for stage, spec in DVC["stages"].items()
                if any(path == out or PurePosixPath(out) in PurePosixPath(path).parents for out in stage_outs(spec))]

    assert {path: written_by(path) for path in plot_paths() if len(written_by(path)) != 1} == {}


def test_each_training_stage_curves_are_a_plot():
    trained = [stage for stage, spec in DVC["stages"].items() if curve_file(stage) in stage_outs(spec)]
    assert sorted(trained) == ["sft", "train"]
    assert [CURVES_PNG.format(stage=stage) for stage in trained
            if CURVES_PNG.format(stage=stage) not in plot_paths()] == []
