"""The row checks every env shares: RowSchema.row's image names, and Env's image count."""

import pytest
from PIL import Image

from vlmgym.data.rows import Row, RowSchema, RowSkip
from vlmgym.envs import Env
from vlmgym.envs.base import State


def parse(rec: dict[str, str]) -> Row:
    if rec["id"] == "bad":
        raise RowSkip("bad_id", "not this one")
    return Row(rec["id"], (rec["left"], rec["right"]), {})


PAIR = RowSchema("pair", ("id", "left", "right"), ("left.jpg", "right.jpg"), parse)
ONE = RowSchema("one", ("id", "image"), ("jpg",), lambda rec: Row(rec["id"], (rec["image"],), {}))


def skip_of(schema: RowSchema, rec: dict[str, str]) -> str:
    with pytest.raises(RowSkip) as err:
        schema.row(rec)
    return str(err.value)


def test_a_row_needs_a_name_for_each_image_after_the_env_own_checks():
    assert PAIR.row({"id": "a", "left": "l.jpg", "right": "r.jpg"}).images == ("l.jpg", "r.jpg")
    assert skip_of(PAIR, {"id": "a", "left": "l.jpg", "right": ""}) == "image_missing: empty left/right image name"
    assert skip_of(PAIR, {"id": "bad", "left": "", "right": ""}) == "bad_id: not this one"  # the env's check first
    assert skip_of(ONE, {"id": "a", "image": ""}) == "image_missing: empty image name"
    assert (PAIR.image_count, PAIR.image_roles, ONE.image_count, ONE.image_roles) == (2, ("left", "right"), 1, ())


class PairEnv(Env):
    name = "pair"
    schema = PAIR

    def prompt(self, sample):
        return "?"

    def score(self, state: State, text: str):
        return 0.0, {}


class Sample:
    def __init__(self, key, images):
        self.key, self.images, self.meta = key, images, {}


def test_an_env_serves_only_samples_with_its_schema_image_count():
    image = Image.new("RGB", (2, 2))
    assert len(PairEnv(samples=[Sample("a", [image, image])])) == 1
    with pytest.raises(ValueError, match=r"pair: sample 'b' has 1 images, expected 2 \(left, right\)"):
        PairEnv(samples=[Sample("a", [image, image]), Sample("b", [image])])
