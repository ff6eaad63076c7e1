"""ovd's synthetic scenes: rec's (nlvr2's coloured shapes, boxes and train/test pools), with a detection question.

A category is a colour and a shape ("red circle"; size is not part of it): 4 x 3 = 12 categories. A sample's
scene is drawn exactly as rec draws its own (vlmgym.envs.nlvr2.data.sample_scene, rec's pools of scene
compositions: vlmgym.envs.rec.scene.in_test_pool, so train and test never share a composition), and each object's
box is rec's (vlmgym.envs.rec.scene.object_box). The question names `named` categories in a shuffled order: half
of them (rounded up; at least one) among those the scene shows, as far as it shows that many, and the rest absent
from it, so naming every category is never right. The truth is every object of a named
category, labelled with its category, in reading order (top to bottom, then left to right).

Deterministic per (seed, split, index); nothing is rendered here (data.py renders with rec's renderer).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vlmgym.envs.nlvr2.data import COLOURS, SHAPES, Scene, SceneObject, sample_scene
from vlmgym.envs.rec import scene as rec_scene

CATEGORIES = tuple(f"{colour} {shape}" for colour in sorted(COLOURS) for shape in SHAPES)
MAX_OBJECTS = rec_scene.MAX_OBJECTS
SCENE_TRIES = 1_000


def category(obj: SceneObject) -> str:
    """The object's category: its colour and shape."""
    return f"{obj.colour} {obj.shape}"


@dataclass(frozen=True)
class OvdSample:
    """One generated sample: the scene, the categories the question names (in prompt order), and the truth:
    (category, pixel box) of every object of a named category."""

    id: str
    scene: Scene
    categories: tuple[str, ...]
    objects: tuple[tuple[str, tuple[float, float, float, float]], ...]


def name_categories(rng: random.Random, present: list[str], named: int) -> tuple[str, ...]:
    """`named` categories, shuffled: some of `present` (at least one) and the rest absent ones."""
    named = min(named, len(CATEGORIES))
    absent = [c for c in CATEGORIES if c not in present]
    wanted = max(1, min(len(present), (named + 1) // 2))
    chosen = rng.sample(sorted(present), wanted)
    chosen += rng.sample(absent, min(len(absent), named - wanted))
    rng.shuffle(chosen)
    return tuple(chosen)


def truth_objects(scene: Scene, categories: tuple[str, ...]) -> tuple[tuple[str, tuple[float, ...]], ...]:
    """(category, pixel box) of each object of a named category, top to bottom then left to right."""
    kept = sorted((o for o in scene if category(o) in categories), key=lambda o: (o.y, o.x))
    return tuple((category(o), rec_scene.object_box(o)) for o in kept)


def generate_sample(seed: int, split: str, index: int, width: int, height: int, min_objects: int, max_objects: int,
                    named: int, object_scale: float = 1.0) -> OvdSample:
    """One sample (nothing rendered): a scene of the split's pool and the categories its question names."""
    rng = random.Random(f"ovd-{seed}-{split}-{index}")
    for _ in range(SCENE_TRIES):
        scene = sample_scene(rng, width, height, None, max_objects, object_scale, min_objects=min_objects)
        if rec_scene.in_test_pool(scene) != (split != "train"):
            continue
        categories = name_categories(rng, sorted({category(o) for o in scene}), named)
        return OvdSample(f"{split}-{index:06d}", scene, categories, truth_objects(scene, categories))
    raise RuntimeError(f"ovd: no {split} scene in {SCENE_TRIES} tries (seed {seed}, index {index})")
