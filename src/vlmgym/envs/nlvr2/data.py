"""NLVR2-style data: a synthetic two-scene statement generator, and the real NLVR2 from the hub.

Both write the nlvr2 raw layout that the shard stage reads:

    {raw}/{train,test}.csv        columns id,sentence,label,left,right[,trace] (label "True"/"False"; trace: what
                                  the synthetic scenes hold, scene_trace; the hub's rows have none)
    {raw}/images/{split}/NN.zip   the jpgs named in the left/right columns (flat member names)

Preset: one command switches the whole pipeline from geospot to nlvr2 (synthetic scenes by default;
add `-S data.source=hub` for the real NLVR2 on a machine that reaches the Hugging Face hub):

    dvc exp run -S env.name=nlvr2

For nlvr2, `data.train_images` / `data.test_images` count image *pairs* (statements) per split.

Synthetic (the default): each image shows non-overlapping circles, squares and triangles in four colours and two
sizes on a tinted, noisy background; statements come from templates (counting, "every ... is <colour>", spatial
relations, comparisons across the two images, existence) and their truth is computed from the scene descriptions.
Exactly half of each split is true; the template is drawn before the label so it does not give the answer away.
Each pair also gets a trace (scene_trace): what each image holds, then, for the exists and exactly_one_image
statements, whether each image has what they are about ("left: blue, red. right: green. red object: left yes, right
no."), which nlvr2's answer gives before the verdict (env.nlvr2.trace). `data.nlvr2` (NLVR2DataParams) picks the
templates, what descriptions name, how many and how large the shapes are; its defaults are the level the tiny
default model learns (the two colour-presence templates over 1-2 shapes at 3x size); the full generator is all
nine templates, full descriptions, 1-6 shapes at scale 1.
With `data.ood_images` > 0 it also writes test_ood: the same statements over shapes of another size
(`data.nlvr2.ood_object_scale`, 2 by default), which train never shows.
Hub: the first N rows of the train and test splits of `data.hub_repo` (default HuggingFaceM4/NLVR2), images
re-encoded as JPEG; its label is a ClassLabel with names ["True", "False"], so a stored 0 means True.
"""

from __future__ import annotations

import contextlib
import contextvars
import csv
import io
import math
import random
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from vlmgym.config.sections import DataParams
from vlmgym.config.spec import spec
from vlmgym.data import layout
from vlmgym.runtime.atomic import atomic_file

SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (214, 39, 40), "green": (44, 160, 44), "blue": (31, 90, 220), "yellow": (240, 200, 20)}
SIZES = ("small", "large")
SIDES = ("left", "right")
RELATIONS = ("to the left of", "to the right of", "above", "below")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
MAX_OBJECTS = 6
ATTRIBUTES = ("size", "colour", "shape")  # what a description ("a large red circle") may name
CSV_COLUMNS = ("id", "sentence", "label", "left", "right", "trace")
IMAGES_PER_ZIP = 10_000
DEFAULT_HUB_REPO = "HuggingFaceM4/NLVR2"
# Scenes tried per statement, and statements tried per pair, until the truth matches the pair's label. Every
# template can be true and false, so running out of statements means a bug, not bad luck.
SCENE_TRIES = 200
STATEMENT_TRIES = 1_000


@dataclass(frozen=True)
class SceneObject:
    """One shape in a scene: centre (x, y) in pixels, y growing downwards."""

    shape: str
    colour: str
    size: str
    x: float
    y: float
    radius: float


Scene = tuple[SceneObject, ...]
Pair = tuple[Scene, Scene]


@dataclass(frozen=True)
class NounPhrase:
    """A description such as 'large red circle'; None attributes match anything."""

    size: str | None = None
    colour: str | None = None
    shape: str | None = None

    def matches(self, obj: SceneObject) -> bool:
        """Whether `obj` fits every given attribute."""
        return all(want is None or want == have for want, have in
                   ((self.size, obj.size), (self.colour, obj.colour), (self.shape, obj.shape)))

    def text(self, plural: bool = False) -> str:
        """'large red circle' / 'large red circles' / 'object'."""
        noun = (self.shape or "object") + ("s" if plural else "")
        return " ".join(w for w in (self.size, self.colour, noun) if w)

    def with_article(self) -> str:
        """'a red circle', 'an object'."""
        words = self.text()
        return ("an " if words[0] in "aeiou" else "a ") + words


@dataclass(frozen=True)
class Statement:
    """A sentence, its truth over (left, right) scenes (None: does not apply), and the attributes it names;
    `about`: the description whose presence in each image decides it (exists, exactly_one_image), which the trace
    looks up."""

    text: str
    check: Callable[[Pair], bool | None]
    colours: tuple[str, ...] = ()
    shapes: tuple[str, ...] = ()
    about: NounPhrase | None = None


@dataclass(frozen=True)
class SyntheticPair:
    """One generated example: two scene descriptions, a statement, its truth value and the scenes' trace."""

    id: str
    sentence: str
    label: bool
    template: str
    left: Scene
    right: Scene
    trace: str = ""


# --- scenes --------------------------------------------------------------------


def sample_scene(rng: random.Random, width: int, height: int, mentioned: Statement | None = None,
                 max_objects: int = MAX_OBJECTS, object_scale: float = 1.0, min_objects: int = 1) -> Scene:
    """min_objects..max_objects shapes that neither overlap nor line up, so counts and relations are visible;
    `object_scale` multiplies the shapes' radii. (The rec env draws its scenes here too, with more objects.)"""
    base = min(width, height)
    radii = {"small": 0.065 * object_scale * base, "large": 0.11 * object_scale * base}
    gap = 0.04 * base  # also the minimum x and y offset between centres: no ambiguous left/right/above/below
    # A restricted palette for some scenes makes "every ...", "same number" and "neither" statements come true.
    colours = rng.sample(sorted(COLOURS), rng.choice((1, 2, 4)))
    shapes = rng.sample(SHAPES, rng.choice((1, 2, 3)))
    if mentioned is not None and rng.random() < 0.5:
        # Half the scenes use what the statement talks about, as a person describing them would: rare statements
        # then come out true or false often enough that the wording never has to be redrawn to fit the label.
        colours = sorted(set(colours) | set(mentioned.colours))
        shapes = sorted(set(shapes) | set(mentioned.shapes))
    count = rng.randint(min_objects, max_objects)
    for _ in range(100):
        objects: list[SceneObject] = []
        for _ in range(count):
            for _ in range(60):
                size = rng.choice(SIZES)
                r = radii[size]
                x, y = rng.uniform(r + 2, width - r - 2), rng.uniform(r + 2, height - r - 2)
                if all(math.hypot(x - o.x, y - o.y) >= r + o.radius + gap and abs(x - o.x) >= gap
                       and abs(y - o.y) >= gap for o in objects):
                    objects.append(SceneObject(rng.choice(shapes), rng.choice(colours), size, x, y, r))
                    break
            else:
                break
        if len(objects) == count:
            return tuple(objects)
    raise RuntimeError(f"could not place {count} shapes in a {width}x{height} image")


def render_scene(scene: Scene, width: int, height: int, rng: random.Random) -> Image.Image:
    """Draw a scene on a slightly tinted, noisy background (nuisance variation only)."""
    background = tuple(rng.randint(215, 245) for _ in range(3))
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    for o in scene:
        fill = COLOURS[o.colour]
        if o.shape == "circle":
            draw.ellipse((o.x - o.radius, o.y - o.radius, o.x + o.radius, o.y + o.radius), fill=fill)
        elif o.shape == "square":
            half = 0.85 * o.radius
            draw.rectangle((o.x - half, o.y - half, o.x + half, o.y + half), fill=fill)
        else:  # equilateral triangle pointing up, centroid at (x, y)
            r = o.radius
            draw.polygon([(o.x, o.y - r), (o.x - 0.866 * r, o.y + r / 2), (o.x + 0.866 * r, o.y + r / 2)], fill=fill)
    noise = np.random.default_rng(rng.getrandbits(64)).integers(0, 13, size=(height, width, 3), dtype=np.uint8)
    # +-6 in uint8 without clipping: every drawn value (fills and background) lies in [14, 245].
    return Image.fromarray(np.asarray(image) - np.uint8(6) + noise)


# --- statements ------------------------------------------------------------------


def _count(scene: Scene, phrase: NounPhrase) -> int:
    return sum(phrase.matches(o) for o in scene)


def scene_trace(scenes: Pair, attributes: Sequence[str] = ATTRIBUTES, about: NounPhrase | None = None) -> str:
    """What each image holds, in the words descriptions may use, then, for a statement decided by where something
    is (Statement.about), whether each image has it: 'left: blue, red. right: green. red object: left yes, right
    no.' The kinds are sorted, each named once (with colour alone, the colours). nlvr2's answer writes it before
    the verdict (NLVR2Env, env.nlvr2.trace): what is seen first, then the lookup the verdict follows from, so the
    statement x image binding a one-word verdict never taught the tiny model becomes a comparison of words."""
    parts = []
    for side, scene in zip(SIDES, scenes):
        kinds = sorted({" ".join(getattr(o, a) for a in ATTRIBUTES if a in attributes) for o in scene})
        parts.append(f"{side}: {', '.join(kinds)}.")
    if about is not None:
        has = [("yes" if _count(scene, about) else "no") for scene in scenes]
        parts.append(f"{about.text()}: left {has[0]}, right {has[1]}.")
    return " ".join(parts)


# The attributes descriptions may name, set per pair by generate_pair: a context variable rather than an argument of
# every template, so the templates' wording code stays as it is; draws are made (and dropped) either way, so the
# random stream is the same whatever is allowed.
_PHRASE_ATTRIBUTES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("nlvr2_phrase_attributes",
                                                                                       default=ATTRIBUTES)


def _allowed(attribute: str, value: str | None) -> str | None:
    return value if attribute in _PHRASE_ATTRIBUTES.get() else None


def _sample_phrase(rng: random.Random, specific: bool = False) -> NounPhrase:
    """A random description; `specific` excludes the bare 'object' (every scene has one, so it is always there)."""
    while True:
        phrase = NounPhrase(size=_allowed("size", rng.choice(SIZES) if rng.random() < 0.25 else None),
                            colour=_allowed("colour", rng.choice(sorted(COLOURS)) if rng.random() < 0.6 else None),
                            shape=_allowed("shape", rng.choice(SHAPES) if rng.random() < 0.7 else None))
        if not specific or phrase != NounPhrase():
            return phrase


def _related(a: SceneObject, b: SceneObject, relation: str) -> bool:
    return {"to the left of": a.x < b.x, "to the right of": a.x > b.x, "above": a.y < b.y, "below": a.y > b.y}[relation]


def _statement(text: str, check: Callable[[Pair], bool | None], *phrases: NounPhrase,
               colours: tuple[str, ...] = (), shapes: tuple[str, ...] = (), about: NounPhrase | None = None
               ) -> Statement:
    colours += tuple(p.colour for p in phrases if p.colour)
    shapes += tuple(p.shape for p in phrases if p.shape)
    return Statement(text, check, colours, shapes, about)


def _count_exact(rng: random.Random) -> Statement:
    side, phrase, n = rng.randrange(2), _sample_phrase(rng), rng.randint(1, 4)
    verb = "is" if n == 1 else "are"
    text = f"There {verb} exactly {NUMBER_WORDS[n]} {phrase.text(n != 1)} in the {SIDES[side]} image."
    return _statement(text, lambda scenes: _count(scenes[side], phrase) == n, phrase)


def _count_at_least(rng: random.Random) -> Statement:
    side, phrase, n = rng.randrange(2), _sample_phrase(rng), rng.randint(2, 4)
    text = f"The {SIDES[side]} image contains at least {NUMBER_WORDS[n]} {phrase.text(True)}."
    return _statement(text, lambda scenes: _count(scenes[side], phrase) >= n, phrase)


def _count_total(rng: random.Random) -> Statement:
    phrase, n = _sample_phrase(rng), rng.randint(2, 6)
    text = f"There are exactly {NUMBER_WORDS[n]} {phrase.text(True)} in the two images combined."
    return _statement(text, lambda scenes: _count(scenes[0], phrase) + _count(scenes[1], phrase) == n, phrase)


def _every_colour(rng: random.Random) -> Statement:
    side, colour, shape = rng.randrange(2), rng.choice(sorted(COLOURS)), _allowed("shape", rng.choice([*SHAPES, None]))

    def check(scenes: Pair) -> bool | None:
        members = [o for o in scenes[side] if shape is None or o.shape == shape]
        # "every X is red" about zero Xs would be vacuously true: such scenes are not used
        return all(o.colour == colour for o in members) if members else None

    text = f"Every {shape or 'object'} in the {SIDES[side]} image is {colour}."
    return _statement(text, check, colours=(colour,), shapes=(shape,) if shape else ())


def _spatial(rng: random.Random) -> Statement:
    side, first, second, relation = rng.randrange(2), _sample_phrase(rng), _sample_phrase(rng), rng.choice(RELATIONS)
    text = f"In the {SIDES[side]} image, there is {first.with_article()} {relation} {second.with_article()}."
    return _statement(text, lambda scenes: any(first.matches(a) and second.matches(b) and _related(a, b, relation)
                                               for a in scenes[side] for b in scenes[side] if a is not b),
                      first, second)


def _compare(rng: random.Random) -> Statement:
    side, phrase, word = rng.randrange(2), _sample_phrase(rng), rng.choice(("more", "fewer"))

    def check(scenes: Pair) -> bool:
        mine, theirs = _count(scenes[side], phrase), _count(scenes[1 - side], phrase)
        return mine > theirs if word == "more" else mine < theirs

    text = f"The {SIDES[side]} image has {word} {phrase.text(True)} than the {SIDES[1 - side]} image."
    return _statement(text, check, phrase)


def _same_number(rng: random.Random) -> Statement:
    phrase = _sample_phrase(rng)
    text = f"Both images contain the same number of {phrase.text(True)}."
    return _statement(text, lambda scenes: _count(scenes[0], phrase) == _count(scenes[1], phrase), phrase)


def _exists(rng: random.Random) -> Statement:
    phrase, form = _sample_phrase(rng, specific=True), rng.randrange(4)
    if form < 2:
        return _statement(f"There is {phrase.with_article()} in the {SIDES[form]} image.",
                          lambda scenes: _count(scenes[form], phrase) > 0, phrase, about=phrase)
    if form == 2:
        return _statement(f"Both images contain {phrase.with_article()}.",
                          lambda scenes: all(_count(s, phrase) > 0 for s in scenes), phrase, about=phrase)
    return _statement(f"Neither image contains {phrase.with_article()}.",
                      lambda scenes: not any(_count(s, phrase) > 0 for s in scenes), phrase, about=phrase)


def _exactly_one_image(rng: random.Random) -> Statement:
    phrase = _sample_phrase(rng, specific=True)
    return _statement(f"Exactly one of the two images contains {phrase.with_article()}.",
                      lambda scenes: sum(_count(s, phrase) > 0 for s in scenes) == 1, phrase, about=phrase)


TEMPLATES: dict[str, Callable[[random.Random], Statement]] = {
    "count_exact": _count_exact,
    "count_at_least": _count_at_least,
    "count_total": _count_total,
    "every_colour": _every_colour,
    "spatial": _spatial,
    "compare": _compare,
    "same_number": _same_number,
    "exists": _exists,
    "exactly_one_image": _exactly_one_image,
}


def balanced_labels(count: int, seed: int, split: str) -> list[bool]:
    """count // 2 True and the rest False, in a seeded order."""
    labels = [True] * (count // 2) + [False] * (count - count // 2)
    random.Random(f"nlvr2-labels-{seed}-{split}").shuffle(labels)
    return labels


def generate_pair(seed: int, split: str, index: int, label: bool, width: int, height: int,
                  templates: Sequence[str] = (), max_objects: int = MAX_OBJECTS,
                  object_scale: float = 1.0, attributes: Sequence[str] = ATTRIBUTES) -> SyntheticPair:
    """One pair: a statement drawn without looking at `label`, then scenes drawn until its truth equals `label`.

    `templates`: the templates drawn from, uniformly (empty: all); `max_objects`: shapes per image at most;
    `object_scale`: the shapes' size, relative to the default; `attributes`: what descriptions may name (size,
    colour, shape; "a red object" with colour alone)."""
    # The wording is fixed before the scenes, so the text alone says little about the label; it is redrawn only
    # when SCENE_TRIES scenes could not give the wanted truth value (rare statements).
    rng = random.Random(f"nlvr2-{seed}-{split}-{index}")
    name = rng.choice(sorted(templates or TEMPLATES))
    token = _PHRASE_ATTRIBUTES.set(tuple(attributes))
    try:
        return _draw_pair(rng, name, seed, split, index, label, width, height, max_objects, object_scale)
    finally:
        _PHRASE_ATTRIBUTES.reset(token)


def _draw_pair(rng: random.Random, name: str, seed: int, split: str, index: int, label: bool, width: int,
               height: int, max_objects: int, object_scale: float) -> SyntheticPair:
    for _ in range(STATEMENT_TRIES):
        statement = TEMPLATES[name](rng)
        for _ in range(SCENE_TRIES):
            scenes = tuple(sample_scene(rng, width, height, statement, max_objects, object_scale) for _ in range(2))
            if statement.check(scenes) is label:
                trace = scene_trace(scenes, _PHRASE_ATTRIBUTES.get(), statement.about)
                return SyntheticPair(f"{split}-{index:06d}", statement.text, label, name, scenes[0], scenes[1],
                                     trace)
    raise RuntimeError(f"template {name!r} gave no {label} statement in {STATEMENT_TRIES} statements "
                       f"(seed {seed}, {split} pair {index})")


def generate_split(seed: int, split: str, count: int, width: int, height: int, templates: Sequence[str] = (),
                   max_objects: int = MAX_OBJECTS, object_scale: float = 1.0,
                   attributes: Sequence[str] = ATTRIBUTES) -> list[SyntheticPair]:
    """`count` balanced, deterministic pairs (scene descriptions only, nothing rendered); see generate_pair."""
    unknown = sorted(set(templates) - set(TEMPLATES))
    if unknown:
        raise ValueError(f"nlvr2: unknown templates {unknown}; known: {sorted(TEMPLATES)}")
    labels = balanced_labels(count, seed, split)
    if not set(attributes) <= set(ATTRIBUTES) or "colour" not in attributes:
        # colour is what every_colour is about, and what keeps "exists" statements from all being about bare objects
        raise ValueError(f"nlvr2: attributes {list(attributes)} must include colour and be among {list(ATTRIBUTES)}")
    return [generate_pair(seed, split, i, labels[i], width, height, templates, max_objects, object_scale, attributes)
            for i in range(count)]


def statement_corpus(count: int = 400, seed: int = 0) -> list[str]:
    """Example statements of every template (no scenes needed), e.g. for training a tokenizer."""
    rng = random.Random(f"nlvr2-corpus-{seed}")
    names = sorted(TEMPLATES)
    return [TEMPLATES[names[i % len(names)]](rng).text for i in range(count)]


# --- raw layout writing ---------------------------------------------------------------


@dataclass(frozen=True)
class RawRecord:
    """One row of the raw layout with its two encoded jpgs."""

    id: str
    sentence: str
    label: bool
    left_jpg: bytes
    right_jpg: bytes
    trace: str = ""  # the synthetic scenes' description (scene_trace); the hub has none


def write_raw_split(out_dir: str | Path, split: str, records: Iterable[RawRecord]) -> int:
    """Write {split}.csv and images/{split}/NN.zip atomically; returns the number of rows written."""
    out_dir = Path(out_dir)
    rows = 0
    zip_paths: list[Path] = []
    # Every file goes to a temp name and is renamed only when all of them are complete; the stack renames in
    # reverse order, so the CSV (entered first) appears last.
    with contextlib.ExitStack() as stack:
        csv_file = stack.enter_context(stack.enter_context(atomic_file(layout.csv_path(out_dir, split)))
                                       .open("w", newline="", encoding="utf-8"))
        writer = csv.writer(csv_file, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        archive: zipfile.ZipFile | None = None
        for record in records:
            if rows * 2 % IMAGES_PER_ZIP == 0:
                if archive is not None:
                    archive.close()
                zip_paths.append(layout.zip_dir(out_dir, split) / layout.zip_name(len(zip_paths)))
                archive = zipfile.ZipFile(stack.enter_context(atomic_file(zip_paths[-1])), "w")
                stack.callback(archive.close)
            left, right = f"{record.id}-left.jpg", f"{record.id}-right.jpg"
            for name, data in ((left, record.left_jpg), (right, record.right_jpg)):
                # fixed timestamps: identical content gives identical bytes, so DVC hashes are stable
                info = zipfile.ZipInfo(name, date_time=layout.ZIP_DATE_TIME)
                info.external_attr = 0o644 << 16
                archive.writestr(info, data)  # stored, not deflated: jpgs do not shrink
            writer.writerow((record.id, record.sentence, "True" if record.label else "False", left, right,
                             record.trace))
            rows += 1
    for stale in set(layout.split_zips(out_dir, split)) - set(zip_paths):  # left by an earlier, larger run
        stale.unlink()
    return rows


def _synthetic_records(pairs: list[SyntheticPair], seed: int, split: str, width: int,
                       height: int) -> Iterator[RawRecord]:
    for i, pair in enumerate(pairs):
        rng = random.Random(f"nlvr2-render-{seed}-{split}-{i}")
        left, right = (layout.encode_jpeg(render_scene(s, width, height, rng)) for s in (pair.left, pair.right))
        yield RawRecord(pair.id, pair.sentence, pair.label, left, right, pair.trace)


# The embedded default: statements about where a colour is (there is / both / neither / exactly one),
# decided by the scene trace nlvr2's answer writes first, over at most two shapes of three times the full
# generator's size. The tiny random model sees shapes that large at 12 tokens per image and learns to name their
# colours; the full generator's small shapes and counting / spatial statements it does not learn (docs/envs/nlvr2.md).
DEFAULT_TEMPLATES = ("exactly_one_image", "exists")
DEFAULT_ATTRIBUTES = ("colour",)
DEFAULT_MAX_OBJECTS = 2
DEFAULT_OBJECT_SCALE = 3.0


@dataclass(frozen=True)
class NLVR2DataParams:
    """nlvr2's synthetic generator: which statements, what descriptions name, how many and how large the shapes.

    The defaults are the level the tiny default model learns (DEFAULT_*: colour statements over at most two large
    shapes). The full generator is templates [] (all nine), attributes [size, colour, shape], max_objects 6,
    object_scale 1: on it the tiny model learns nothing (SFT drives the images' effect on the answer to
    ~1e-5 and answers True everywhere); it is here for a pretrained model and to study what a model learns, with
    the per-type accuracy of the evaluate stage."""

    templates: list[str] = spec(default_factory=lambda: list(DEFAULT_TEMPLATES), choices=tuple(sorted(TEMPLATES)),
                                doc="statement templates drawn, uniformly (empty: all nine)")
    attributes: list[str] = spec(default_factory=lambda: list(DEFAULT_ATTRIBUTES), choices=ATTRIBUTES,
                                 doc="what descriptions (statements and trace) may name: size, colour, shape "
                                     "(colour is required)")
    max_objects: int = spec(DEFAULT_MAX_OBJECTS, ge=1, le=MAX_OBJECTS, doc="shapes per image at most (1 to this "
                                                                             "many)")
    object_scale: float = spec(DEFAULT_OBJECT_SCALE, gt=0, le=4, doc="the shapes' radii relative to 6.5% / 11% "
                                                                     "(small / large) of the image's shorter side")
    train_pairs: int = spec(0, ge=0, doc="pairs in the train split (0: data.train_images)")
    ood_object_scale: float = spec(2.0, gt=0, le=4, doc="the shapes' scale in the out-of-distribution split "
                                                        "test_ood (data.ood_images pairs; train and test use "
                                                        "object_scale)")

    def knobs(self) -> dict[str, Any]:
        """The generate_split keywords of these settings."""
        return {"templates": list(self.templates), "max_objects": self.max_objects, "object_scale": self.object_scale,
                "attributes": list(self.attributes)}


def write_synthetic_raw(params: DataParams, out_dir: str | Path,
                        settings: NLVR2DataParams | None = None) -> dict[str, int]:
    """Render train_images / test_images synthetic pairs (and ood_images pairs of test_ood, whose shapes have
    another size) into the raw layout; returns counts."""
    settings = settings or NLVR2DataParams()
    counts: dict[str, int] = {}
    splits = [("train", settings.train_pairs or params.train_images), ("test", params.test_images)]
    if params.ood_images:
        splits.append(("test_ood", params.ood_images))
    for split, count in splits:
        knobs = settings.knobs()
        if split == "test_ood":
            knobs["object_scale"] = settings.ood_object_scale
        pairs = generate_split(params.seed, split, count, params.image_width, params.image_height, **knobs)
        records = _synthetic_records(pairs, params.seed, split, params.image_width, params.image_height)
        counts[f"{split}_pairs"] = write_raw_split(out_dir, split, records)
        counts[f"{split}_true"] = sum(p.label for p in pairs)
    return counts


# --- the real NLVR2 from the hub ----------------------------------------------------------

HUB_SPLITS = {"train": "train", "test": "test"}


def load_hub_split(repo: str, split: str) -> Any:
    """The one network call: stream a split of the hub dataset (with `.features`) as rows of dicts."""
    import datasets

    # HuggingFaceM4/NLVR2 is a loading script, which `datasets` >= 4 refuses to run (and trust_remote_code is off
    # limits here): read the hub's own parquet export of it instead.
    return datasets.load_dataset(repo, split=split, streaming=True, revision="refs/convert/parquet")


def label_decoder(feature: Any) -> Callable[[Any], bool | None]:
    """Maps stored label values to bools (None: no label), from the dataset's label feature (None: infer)."""
    names = getattr(feature, "names", None)
    if names is not None:  # ClassLabel: the hub NLVR2 has names ["True", "False"], so 0 means True
        lowered = [str(n).strip().lower() for n in names]
        if sorted(lowered) != ["false", "true"]:
            raise ValueError(f"label ClassLabel names {names} are not True/False")

        def decode_class(value: Any) -> bool | None:
            if value is None or int(value) == -1:  # -1 is how `datasets` stores a missing ClassLabel
                return None
            if not 0 <= int(value) < len(lowered):
                raise ValueError(f"label value {value!r} is outside ClassLabel names {names}")
            return lowered[int(value)] == "true"

        return decode_class
    dtype = getattr(feature, "dtype", None)
    if dtype is not None and dtype not in ("bool", "string", "large_string"):
        raise ValueError(f"label feature of type {dtype!r} has no True/False meaning (expected ClassLabel, "
                         "string or bool)")

    def decode(value: Any) -> bool | None:
        if value is None:
            return None
        if isinstance(value, bool | np.bool_):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError(f"label value {value!r} is not True/False")

    return decode


def _as_image(value: Any) -> Image.Image:
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, dict) and value.get("bytes"):
        return Image.open(io.BytesIO(value["bytes"]))
    if isinstance(value, dict) and value.get("path"):
        return Image.open(value["path"])
    raise ValueError(f"not an image: {type(value).__name__}")


def _hub_records(rows: Iterable[dict], features: Any, split: str, limit: int,
                 skipped: dict[str, int]) -> Iterator[RawRecord]:
    decode_label = label_decoder(features["label"] if features is not None and "label" in features else None)
    seen: set[str] = set()
    taken = 0
    for index, row in enumerate(rows):
        raw_id = str(row.get("identifier") or f"{split}-{index:06d}")
        row_id = re.sub(r"[^A-Za-z0-9_-]", "_", raw_id)  # no dots: webdataset splits sample names at dots
        sentence = " ".join(str(row.get("sentence") or "").split())
        try:
            label = decode_label(row.get("label"))
        except (ValueError, TypeError) as err:  # a schema problem, not one bad row: stop and say where
            raise ValueError(f"{split} row {index} (id {raw_id}): {err}") from err
        reason = None
        if label is None:
            reason = "no_label"
        elif not sentence:
            reason = "empty_sentence"
        elif row_id in seen:
            reason = "duplicate_id"
        else:
            try:
                jpgs = [layout.encode_jpeg(_as_image(row[key])) for key in ("left_image", "right_image")]
            except (OSError, ValueError, KeyError, Image.DecompressionBombError):
                reason = "bad_image"
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        seen.add(row_id)
        yield RawRecord(row_id, sentence, label, jpgs[0], jpgs[1])
        taken += 1
        if taken >= limit:  # stop before pulling another row from a (streamed) split
            return


def download_hub_raw(params: DataParams, out_dir: str | Path,
                     load_fn: Callable[[str, str], Any] | None = None) -> dict[str, int]:
    """Convert the first train_images / test_images pairs of the hub NLVR2 into the raw layout; returns counts."""
    load_fn = load_fn or load_hub_split
    repo = params.hub_repo or DEFAULT_HUB_REPO
    counts: dict[str, int] = {}
    for split, limit in (("train", params.train_images), ("test", params.test_images)):
        rows = load_fn(repo, HUB_SPLITS[split])
        skipped: dict[str, int] = {}
        records = _hub_records(rows, getattr(rows, "features", None), split, limit, skipped)
        counts[f"{split}_pairs"] = write_raw_split(out_dir, split, records)
        counts.update({f"{split}_skipped_{reason}": n for reason, n in sorted(skipped.items())})
    return counts
