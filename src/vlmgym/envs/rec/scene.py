"""rec's scenes and referring expressions: nlvr2's coloured shapes, one of them picked out by an expression such as
"the small red circle to the left of the blue square" that fits it and no other object of the scene.

Scenes are nlvr2's (vlmgym.envs.nlvr2.data.sample_scene and render_scene): circles, squares and triangles in four
colours and two sizes that neither overlap nor line up, so "left of" and "above" are never a close call. An
expression names a description of the target (any of its size, colour and shape; "object" when it names no shape)
and, optionally, a relation (nlvr2's RELATIONS, between centres) to an anchor: "the <target> <relation> the
<anchor>", where the anchor's description fits exactly one object, as "the" promises.

Ambiguity is checked by construction: referents() is the matcher, reading the expression back from its text
(parse_expression), and a sample is kept only when it picks out exactly the target; otherwise the scene is drawn
again. A relation is only used where it is needed (the target's description alone fits several objects), so it
always carries information; `relation_share` sets how often one is used when an attribute-only expression also fits.

Train and test never share a scene composition (the multiset of size-colour-shape objects): compositions are split
once, by a hash, into a train pool (about 80%) and a test pool; test and test_ood draw theirs from the test pool.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from dataclasses import dataclass

from vlmgym.envs.nlvr2.data import COLOURS, RELATIONS, SHAPES, SIZES, NounPhrase, Scene, SceneObject, sample_scene

MAX_OBJECTS = 9  # the most a scene holds (the OOD split's crowding); 9 still fit on a 256x192 canvas
TEST_POOL_PERCENT = 20
SCENE_TRIES = 1_000  # scenes drawn per sample until one fits its split's pool and has an unambiguous expression

_PHRASE = rf"(?:({'|'.join(SIZES)}) )?(?:({'|'.join(sorted(COLOURS))}) )?({'|'.join(SHAPES)}|object)"
EXPRESSION_PATTERN = re.compile(rf"the {_PHRASE}(?: ({'|'.join(RELATIONS)}) the {_PHRASE})?")


@dataclass(frozen=True)
class Expression:
    """'the <target>' or 'the <target> <relation> the <anchor>'."""

    target: NounPhrase
    relation: str | None = None
    anchor: NounPhrase | None = None

    def text(self) -> str:
        """The words, e.g. 'the small red circle to the left of the blue square'."""
        words = f"the {self.target.text()}"
        return words if self.relation is None else f"{words} {self.relation} the {self.anchor.text()}"


def parse_expression(text: str) -> Expression | None:
    """An expression read back from its words (None: not one the generator writes)."""
    match = EXPRESSION_PATTERN.fullmatch(text)
    if match is None:
        return None
    size, colour, shape, relation, a_size, a_colour, a_shape = match.groups()

    def phrase(s: str | None, c: str | None, noun: str | None) -> NounPhrase:
        return NounPhrase(s, c, None if noun == "object" else noun)

    if relation is None:
        return Expression(phrase(size, colour, shape))
    return Expression(phrase(size, colour, shape), relation, phrase(a_size, a_colour, a_shape))


def related(a: SceneObject, b: SceneObject, relation: str) -> bool:
    """Whether `a` is <relation> `b`, centre to centre (image y grows downwards)."""
    return {"to the left of": a.x < b.x, "to the right of": a.x > b.x, "above": a.y < b.y, "below": a.y > b.y}[relation]


def referents(expression: Expression, scene: Scene) -> list[int]:
    """Indices of the objects `expression` fits: its target description and, with a relation, standing in it to
    the one object the anchor describes (an anchor that fits none or several objects is no anchor: nothing)."""
    fits = [i for i, o in enumerate(scene) if expression.target.matches(o)]
    if expression.relation is None:
        return fits
    anchors = [j for j, o in enumerate(scene) if expression.anchor.matches(o)]
    if len(anchors) != 1:
        return []
    anchor = scene[anchors[0]]
    return [i for i in fits if i != anchors[0] and related(scene[i], anchor, expression.relation)]


def descriptions(obj: SceneObject) -> list[NounPhrase]:
    """Every description that fits `obj`: each subset of its size, colour and shape ('object' names none)."""
    return [NounPhrase(obj.size if s else None, obj.colour if c else None, obj.shape if h else None)
            for s, c, h in itertools.product((False, True), repeat=3)]


def full_label(obj: SceneObject) -> str:
    """The object's whole description, the answer's label: 'small red circle'."""
    return NounPhrase(obj.size, obj.colour, obj.shape).text()


def object_box(obj: SceneObject) -> tuple[float, float, float, float]:
    """The pixel box (x1, y1, x2, y2) of the shape render_scene draws for `obj` (its geometry, mirrored here;
    tests/envs/test_rec.py checks it against rendered pixels)."""
    r = obj.radius
    if obj.shape == "circle":
        return obj.x - r, obj.y - r, obj.x + r, obj.y + r
    if obj.shape == "square":
        half = 0.85 * r
        return obj.x - half, obj.y - half, obj.x + half, obj.y + half
    return obj.x - 0.866 * r, obj.y - r, obj.x + 0.866 * r, obj.y + r / 2  # triangle pointing up, centroid (x, y)


def composition(scene: Scene) -> tuple[tuple[str, str, str], ...]:
    """The scene's objects as a sorted multiset of (size, colour, shape), positions left out."""
    return tuple(sorted((o.size, o.colour, o.shape) for o in scene))


def in_test_pool(scene: Scene) -> bool:
    """Whether the scene's composition belongs to the test pool: a hash of the composition alone, so the pools
    depend on no seed and never overlap."""
    digest = hashlib.sha256(f"rec-pool-{composition(scene)}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < TEST_POOL_PERCENT


def candidate_expressions(scene: Scene, target: int) -> tuple[list[Expression], list[Expression]]:
    """(attribute-only, relational) expressions that pick out exactly `scene[target]`; a relational one only where
    its target description alone fits several objects."""
    unique = [target]
    attribute, relational = [], []
    anchors = [(j, p) for j, o in enumerate(scene) if j != target for p in descriptions(o)
               if sum(p.matches(x) for x in scene) == 1]
    for phrase in descriptions(scene[target]):
        if referents(Expression(phrase), scene) == unique:
            attribute.append(Expression(phrase))
            continue
        for j, anchor in anchors:
            for relation in RELATIONS:
                if related(scene[target], scene[j], relation):
                    expression = Expression(phrase, relation, anchor)
                    if referents(expression, scene) == unique:
                        relational.append(expression)
    return attribute, relational


@dataclass(frozen=True)
class RecSample:
    """One generated sample: the scene, which object is meant, how it is said, and its pixel box."""

    id: str
    scene: Scene
    target: int
    expression: str
    label: str
    box: tuple[float, float, float, float]


def generate_sample(seed: int, split: str, index: int, width: int, height: int, min_objects: int, max_objects: int,
                    relation_share: float, object_scale: float = 1.0) -> RecSample:
    """One sample (nothing rendered): a scene of the split's pool, a target, an expression only it fits."""
    rng = random.Random(f"rec-{seed}-{split}-{index}")
    for _ in range(SCENE_TRIES):
        scene = sample_scene(rng, width, height, None, max_objects, object_scale, min_objects=min_objects)
        if in_test_pool(scene) != (split != "train"):
            continue
        target = rng.randrange(len(scene))
        attribute, relational = candidate_expressions(scene, target)
        if relational and (not attribute or rng.random() < relation_share):
            expression = rng.choice(relational)
        elif attribute:
            expression = rng.choice(attribute)
        else:
            continue  # e.g. two small red circles side by side with nothing to tell them apart: draw again
        text = expression.text()
        parsed = parse_expression(text)
        if parsed is None or referents(parsed, scene) != [target]:  # the words, read back, must mean the target
            raise RuntimeError(f"rec: expression {text!r} does not pick out object {target} of {scene}")
        obj = scene[target]
        return RecSample(f"{split}-{index:06d}", scene, target, text, full_label(obj), object_box(obj))
    raise RuntimeError(f"rec: no unambiguous {split} sample in {SCENE_TRIES} scenes (seed {seed}, index {index}, "
                       f"{min_objects}-{max_objects} objects on {width}x{height})")


def expression_corpus(count: int = 300, seed: int = 0) -> list[str]:
    """Example expressions of both kinds (for the tokenizer), from scenes of every size."""
    rng = random.Random(f"rec-corpus-{seed}")
    texts = []
    for i in range(count):
        scene = sample_scene(rng, 256, 192, None, MAX_OBJECTS, 1.0, min_objects=2)
        attribute, relational = candidate_expressions(scene, rng.randrange(len(scene)))
        pool = relational if i % 2 and relational else attribute or relational
        if pool:
            texts.append(rng.choice(pool).text())
    return texts
