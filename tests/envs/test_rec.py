"""The rec env: its generator (determinism, unambiguous expressions, disjoint train/test compositions, the crowded
OOD split, boxes that fit the rendered shapes), row schema, metrics, the report's box images, the hub loader on a
local parquet fixture, the tokenizer corpus, and the env served from shards (resized ones too).
(The box convention, parser and reward: test_rec_boxes.py.)"""

from __future__ import annotations

import io
import random
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from shard_helpers import build_shards

from vlmgym import envs
from vlmgym.data import layout
from vlmgym.data.rows import RowSkip
from vlmgym.data.shard_writer import shard_raw
from vlmgym.envs import registry
from vlmgym.envs.nlvr2.data import COLOURS, RELATIONS, SceneObject, render_scene, sample_scene
from vlmgym.envs.rec import RecEnv, RecParams, pixels_to_qwen, qwen_to_pixels
from vlmgym.envs.rec import data as rec_data
from vlmgym.envs.rec import env as rec_env
from vlmgym.envs.rec import report as rec_report
from vlmgym.envs.rec import scene as rec_scene
from vlmgym.envs.rec.env import LABEL_FIRST_PROMPT, PROMPT, parse_row
from vlmgym.eval.report import THUMBNAIL_PX
from vlmgym.params import DataParams, ParamsError, ShardParams
from vlmgym.stats.bootstrap import Statistic

SMALL = DataParams(source="synthetic", seed=3, train_images=10, test_images=6, ood_images=4,
                   image_width=128, image_height=96)


def _read_raw(raw, split):
    rows = [dict(zip(header, fields)) for _, header, fields in layout.iter_csv(layout.csv_path(raw, split))]
    members = {}
    for path in layout.split_zips(raw, split):
        with zipfile.ZipFile(path) as archive:
            members.update({name: archive.read(name) for name in archive.namelist()})
    return rows, members


# --- generator ------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec")
    RecEnv.write_synthetic(SMALL, root / "a")
    RecEnv.write_synthetic(SMALL, root / "b")
    return root


def test_generator_is_byte_identical_on_rerun(raw):
    files = sorted(p.relative_to(raw / "a") for p in (raw / "a").rglob("*") if p.is_file())
    assert {str(f) for f in files} == {"train.csv", "test.csv", "test_ood.csv", "images/train/00.zip",
                                       "images/test/00.zip", "images/test_ood/00.zip"}
    for f in files:
        assert (raw / "a" / f).read_bytes() == (raw / "b" / f).read_bytes(), f


def test_generator_rows_are_valid_and_hold_their_images(raw):
    for split, count in (("train", 10), ("test", 6), ("test_ood", 4)):
        rows, members = _read_raw(raw / "a", split)
        assert len(rows) == count and tuple(rows[0]) == rec_data.CSV_COLUMNS
        assert sorted(members) == sorted(r["image"] for r in rows)
        for rec in rows:
            row = parse_row(rec)  # every written row passes the schema
            assert (rec["width"], rec["height"]) == ("128", "96")
            assert Image.open(io.BytesIO(members[rec["image"]])).size == (128, 96)
            assert row.meta["expression"].startswith("the ") and len(row.meta["label"].split()) == 3


def _independent_referents(text: str, scene) -> list[int]:
    """A second reading of an expression, from its words alone (not scene.py's matcher)."""
    relation = next((r for r in RELATIONS if f" {r} the " in text), None)
    target_words, anchor_words = (text[4:].split(f" {relation} the ") if relation else (text[4:], None))

    def fits(words: str, o) -> bool:
        *attributes, noun = words.split()
        return (noun in ("object", o.shape)) and all(a in (o.size, o.colour) for a in attributes)

    fitting = [i for i, o in enumerate(scene) if fits(target_words, o)]
    if relation is None:
        return fitting
    anchors = [j for j, o in enumerate(scene) if fits(anchor_words, o)]
    if len(anchors) != 1:
        return []
    a = scene[anchors[0]]
    where = {"to the left of": lambda o: o.x < a.x, "to the right of": lambda o: o.x > a.x,
             "above": lambda o: o.y < a.y, "below": lambda o: o.y > a.y}[relation]
    return [i for i in fitting if i != anchors[0] and where(scene[i])]


def test_every_expression_picks_out_exactly_its_target():
    settings = rec_data.RecDataParams()
    kinds = set()
    for split, count in (("train", 150), ("test", 60), ("test_ood", 40)):
        for sample in rec_data.generate_split(7, split, count, 256, 192, settings):
            assert _independent_referents(sample.expression, sample.scene) == [sample.target], sample
            parsed = rec_scene.parse_expression(sample.expression)
            assert rec_scene.referents(parsed, sample.scene) == [sample.target]
            assert parsed.text() == sample.expression
            kinds.add(parsed.relation is not None)
            if parsed.relation is not None:  # a relation only where the description alone is ambiguous
                assert len(rec_scene.referents(replace(parsed, relation=None, anchor=None), sample.scene)) > 1
            target = sample.scene[sample.target]
            assert sample.label == f"{target.size} {target.colour} {target.shape}"
    assert kinds == {True, False}


def test_matcher_by_hand():
    def obj(shape, colour, size, x, y):
        return SceneObject(shape, colour, size, x, y, 10.0)

    scene = (obj("circle", "red", "small", 20, 20), obj("circle", "red", "small", 80, 60),
             obj("square", "blue", "large", 50, 40))
    read = rec_scene.parse_expression
    assert rec_scene.referents(read("the small red circle"), scene) == [0, 1]  # ambiguous: never generated
    assert rec_scene.referents(read("the circle to the left of the blue square"), scene) == [0]
    assert rec_scene.referents(read("the red object below the large square"), scene) == [1]
    assert rec_scene.referents(read("the circle to the left of the red circle"), scene) == []  # anchor not unique
    assert rec_scene.referents(read("the square"), scene) == [2]
    assert read("the purple circle") is None and read("a red circle") is None
    attribute, relational = rec_scene.candidate_expressions(scene, 0)
    assert attribute == [] and {e.text() for e in relational} >= {"the circle to the left of the blue square",
                                                                   "the circle above the large square"}


def test_train_and_test_never_share_a_scene_composition():
    settings = rec_data.RecDataParams()
    train = {rec_scene.composition(s.scene) for s in rec_data.generate_split(0, "train", 300, 256, 192, settings)}
    for split in ("test", "test_ood"):
        for sample in rec_data.generate_split(0, split, 100, 256, 192, settings):
            assert rec_scene.in_test_pool(sample.scene) and rec_scene.composition(sample.scene) not in train
    assert not any(rec_scene.in_test_pool(s.scene) for s in rec_data.generate_split(1, "train", 50, 256, 192))
    # about a fifth of the scenes drawn belong to test's pool: the hash of the composition alone decides
    rng = random.Random(0)
    share = np.mean([rec_scene.in_test_pool(sample_scene(rng, 256, 192, None, 5, 1.0, min_objects=2))
                     for _ in range(2000)])
    assert 0.15 < share < 0.25


def test_ood_scenes_are_more_crowded_than_any_train_scene():
    settings = rec_data.RecDataParams()
    assert {len(s.scene) for s in rec_data.generate_split(0, "train", 200, 256, 192, settings)} == {2, 3, 4, 5}
    assert {len(s.scene) for s in rec_data.generate_split(0, "test_ood", 60, 256, 192, settings)} == {7, 8, 9}
    assert "7-9 objects" in RecEnv.ood_note


def test_object_scale_draws_every_split_larger():
    def radii(scale: float, split: str) -> list[float]:
        settings = rec_data.RecDataParams(object_scale=scale, max_objects=4, ood_min_objects=5, ood_max_objects=6)
        return sorted({round(o.radius, 3) for s in rec_data.generate_split(0, split, 40, 256, 192, settings)
                       for o in s.scene})

    for split in ("train", "test", "test_ood"):
        assert radii(2.0, split) == [2 * r for r in radii(1.0, split)]  # the small and the large radius, doubled
    assert rec_data.generate_split(0, "train", 3, 256, 192) == rec_data.generate_split(
        0, "train", 3, 256, 192, rec_data.RecDataParams(object_scale=1.0))  # the default leaves the data as it was


def test_settings_are_checked():
    with pytest.raises(ParamsError, match="max_objects 2 is below min_objects 3"):
        rec_data.RecDataParams(min_objects=3, max_objects=2)
    with pytest.raises(ParamsError, match="ood_min_objects 5 must be above max_objects 5"):
        rec_data.RecDataParams(ood_min_objects=5)
    with pytest.raises(ParamsError, match="ood_max_objects 7 is below ood_min_objects 8"):
        rec_data.RecDataParams(ood_min_objects=8, ood_max_objects=7)


def test_no_ood_split_without_ood_images(tmp_path):
    RecEnv.write_synthetic(replace(SMALL, ood_images=0), tmp_path)
    assert layout.present_splits(tmp_path) == ["train", "test"]


def test_boxes_fit_the_rendered_shapes():
    for shape in ("circle", "square", "triangle"):
        for size, radius in (("small", 12.48), ("large", 21.12)):
            obj = SceneObject(shape, "blue", size, 101.3, 77.6, radius)
            pixels = np.asarray(render_scene((obj,), 256, 192, random.Random(0)))
            ys, xs = np.nonzero(pixels.min(axis=2) < 150)  # the fill; the background is >= 209 everywhere
            x1, y1, x2, y2 = rec_scene.object_box(obj)
            # the drawn pixels span the box give or take PIL's pixel rounding
            assert abs(xs.min() - x1) <= 1.5 and abs(xs.max() + 1 - x2) <= 1.5, (shape, size)
            assert abs(ys.min() - y1) <= 1.5 and abs(ys.max() + 1 - y2) <= 1.5, (shape, size)


# --- row schema ---------------------------------------------------------------------------


GOOD = {"id": "test-000001", "expression": " the  red circle ", "label": "small red circle",
        "box": "64.00 48.00 128.00 96.00", "width": "256", "height": "192", "image": "test-000001.jpg"}


def test_schema_parses_a_good_row_into_0_1000_units():
    row = parse_row(GOOD)
    assert row.key == "test-000001" and row.images == ("test-000001.jpg",)
    assert row.meta == {"id": "test-000001", "expression": "the red circle", "label": "small red circle",
                        "bbox_2d": [250, 250, 500, 500]}


def test_objects_become_relative_centres_and_perception_labels():
    row = parse_row({**GOOD, "objects": "small red circle 96.00 72.00; large blue square 255.00 10.00; "
                                        "small red circle 10.00 10.00"})
    assert row.meta["objects"] == [["small", "red", "circle", 0.375, 0.375],
                                   ["large", "blue", "square", 0.9961, 0.0521],
                                   ["small", "red", "circle", 0.0391, 0.0521]]
    labels = RecEnv.perception_labels(row.meta)
    assert len(labels) == len(RecEnv.perception_heads) == 24 and set(RecEnv.perception_heads) == {13}
    kinds = list(rec_env.KINDS)
    # a 4 x 3 grid: (96, 72) of 256x192 is column 1, row 1 -> cell 5; (255, 10) column 3, row 0 -> cell 3
    assert labels[kinds.index(("small", "red", "circle"))] == 1 + 5  # the first small red circle's cell
    assert labels[kinds.index(("large", "blue", "square"))] == 1 + 3
    assert sum(label > 0 for label in labels) == 2
    assert "objects" not in parse_row(GOOD).meta and "objects" not in parse_row({**GOOD, "objects": " "}).meta
    with pytest.raises(ValueError, match="no scene objects"):
        RecEnv.perception_labels(parse_row(GOOD).meta)


def test_token_labels_name_each_centres_kind_and_place():
    meta = parse_row({**GOOD, "objects": "small red circle 96.00 72.00; large blue square 255.00 10.00; "
                                         "small red circle 70.00 72.00"}).meta
    env = RecEnv
    labels = env.perception_token_labels(meta, 3, 4)
    assert len(labels) == 12 and all(len(t) == len(RecEnv.perception_token_heads) == 3 for t in labels)
    assert RecEnv.perception_token_heads == (25, 21, 21)
    kinds = list(rec_env.KINDS)
    # (96, 72) of 256x192: x 0.375 -> 375 units, bin 7; y 0.375 -> bin 7; column 1, row 1 -> token 5; the second
    # small red circle (70, 72) shares that token and is not labelled over the first
    assert labels[5] == [1 + kinds.index(("small", "red", "circle")), 8, 8]
    # (255, 10): x 0.9961 -> 996 units, the last bin 19; y 0.0521 -> 52 units, bin 1; column 3, row 0 -> token 3
    assert labels[3] == [1 + kinds.index(("large", "blue", "square")), 20, 2]
    assert sum(t != [0, 0, 0] for t in labels) == 2
    # a finer grid puts the two circles in tokens of their own
    assert sum(t != [0, 0, 0] for t in env.perception_token_labels(meta, 6, 8)) == 3
    with pytest.raises(ValueError, match="no scene objects"):
        env.perception_token_labels(parse_row(GOOD).meta, 3, 4)


@pytest.mark.parametrize("objects", ["small red circle 10", "huge red circle 10 10", "small pink circle 10 10",
                                     "small red circle 10 193", "small red circle -1 10", "small red circle x 10",
                                     "small red circle nan 10", "small red circle 10 10 10", "small red; circle"])
def test_malformed_objects_are_counted_skips(objects):
    with pytest.raises(RowSkip) as err:
        parse_row({**GOOD, "objects": objects})
    assert err.value.reason == "bad_objects"


def test_generated_rows_label_the_drawn_scene(raw):
    rows, _ = _read_raw(raw / "a", "train")
    for rec, sample in zip(rows, rec_data.generate_split(SMALL.seed, "train", 10, 128, 96)):
        objects = parse_row(rec).meta["objects"]
        assert [o[:3] for o in objects] == [[obj.size, obj.colour, obj.shape] for obj in sample.scene]
        assert [o[3:] for o in objects] == [pytest.approx([obj.x / 128, obj.y / 96], abs=1e-4) for obj in
                                            sample.scene]
        labels = RecEnv.perception_labels(parse_row(rec).meta)
        assert 1 <= sum(label > 0 for label in labels) <= len(sample.scene)


@pytest.mark.parametrize(("change", "reason"), [
    ({"id": "a.b"}, "bad_id"),
    ({"expression": "  "}, "missing_expression"),
    ({"label": ""}, "missing_label"),
    ({"width": "0"}, "bad_size"),
    ({"height": "19.5"}, "bad_size"),
    ({"width": "wide"}, "bad_size"),
    ({"box": "1 2 3"}, "bad_box"),
    ({"box": "1 2 3 nan"}, "bad_box"),
    ({"box": "1 2 3 inf"}, "bad_box"),
    ({"box": "10 2 3 40"}, "bad_box"),      # x2 < x1
    ({"box": "0 0 257 10"}, "bad_box"),     # beyond the image
    ({"box": "-1 0 10 10"}, "bad_box"),
    ({"box": "a b c d"}, "bad_box"),
    ({"box": "10 10 10.05 50"}, "degenerate_box"),  # under a thousandth of the width
    ({"image": ""}, "image_missing"),
])
def test_schema_skips_bad_rows_with_a_reason(change, reason):
    with pytest.raises(RowSkip) as err:
        RecEnv.schema.row({**GOOD, **change})
    assert err.value.reason == reason


def test_bad_rows_are_counted_by_the_shard_stage(tmp_path):
    RecEnv.write_synthetic(replace(SMALL, ood_images=0), tmp_path / "raw")
    rows, _ = _read_raw(tmp_path / "raw", "test")
    rows[0]["box"] = "1 2 3"
    rows[1]["id"] = "x.y"
    rows[2]["image"] = "nowhere.jpg"
    layout.write_csv(layout.csv_path(tmp_path / "raw", "test"), rec_data.CSV_COLUMNS, [list(r.values()) for r in rows])
    manifest = shard_raw(tmp_path / "raw", tmp_path / "shards", RecEnv.schema, ShardParams(val_samples=0))
    test = manifest["splits"]["test"]
    assert test["kept"] == 3 and test["skipped"]["bad_box"] == 1 and test["skipped"]["bad_id"] == 1
    assert sum(test["skipped"].values()) == 3


# --- metrics ------------------------------------------------------------------------------


def _record(predicted, truth=(100, 100, 300, 300)):
    return {"id": "x", "pred_box": None if predicted is None else list(predicted), "parsed": {},
            "truth": {"expression": "the red circle", "label": "small red circle", "bbox_2d": list(truth)}}


def test_metrics_by_hand():
    records = [_record((100, 100, 300, 300)),   # IoU 1
               _record((100, 100, 300, 200)),   # 0.5: counts at 0.5, not at 0.75
               _record((200, 200, 400, 400)),   # 1/7
               _record(None),                   # no box: 0
               _record((100, 100, 300, 260)),   # 0.8
               _record((300, 300, 100, 100))]   # not a record the env writes (corners out of order): no box
    stats = RecEnv.task_statistics(records)
    assert all(isinstance(s, Statistic) for s in stats.values()) and set(stats) == set(RecEnv.metric_rows)
    points = {name: stat.point() for name, stat in stats.items()}
    assert points == pytest.approx({"mean_iou": (1 + 0.5 + 1 / 7 + 0 + 0.8 + 0) / 6,
                                    "accuracy_iou50": 3 / 6, "accuracy_iou75": 2 / 6})
    assert RecEnv.usable_prediction(records[0]) and not RecEnv.usable_prediction(records[3])
    assert not RecEnv.usable_prediction(records[5])
    with pytest.raises(ValueError, match=r"record 0 .*truth.bbox_2d"):
        RecEnv.task_statistics([_record((1, 2, 3, 4), truth=(1, 2, 3))])


def test_record_fields_and_gallery_text():
    env = RecEnv(samples=[_shard_sample()])
    state, _ = env.reset(0)
    _, info = env.score(state, 'I think [{"bbox_2d": [100, 100, 300, 200]}]')
    fields = RecEnv.record_fields(info, state.meta)
    assert fields["pred_box"] == [100, 100, 300, 200] and fields["parsed"]["iou"] == 0.5
    assert fields["truth"] == {"expression": "the red circle", "label": "small red circle",
                               "bbox_2d": [100, 100, 300, 300]}
    assert RecEnv.truth_text(fields["truth"]) == "the red circle -> [100, 100, 300, 300]"
    assert RecEnv.outcome_text(fields) == "IoU 0.50"
    assert RecEnv.outcome_text({**fields, "pred_box": None}) == "no box"


def _shard_sample(image=None):
    from vlmgym.data.shards import Sample

    return Sample(key="k", images=[image], meta={"id": "k", "expression": "the red circle",
                                                 "label": "small red circle", "bbox_2d": [100, 100, 300, 300]})


# --- the report -----------------------------------------------------------------------------


def test_report_draws_the_boxes_where_they_are():
    image = Image.new("RGB", (256, 192), (128, 128, 128))
    plain = np.asarray(rec_report.draw_boxes(image, None, []), np.int32)
    drawn = np.asarray(rec_report.draw_boxes(image, [100, 100, 500, 500], [([600, 600, 900, 900], "#1f77b4"),
                                                                          (None, "#d62728")]), np.int32)
    assert plain.shape == drawn.shape == (240, 320, 3)  # scaled to 320 px on the longer side
    changed = np.abs(drawn - plain).sum(axis=2) > 0
    ys, xs = np.nonzero(changed)
    # the truth (32, 24)-(160, 120) and the prediction (192, 144)-(288, 216), in pixels of the 320x240 copy
    assert xs.min() == 32 and ys.min() == 24 and xs.max() == 287 and ys.max() == 215
    assert tuple(drawn[70, 33]) == (0, 0, 0) and tuple(drawn[180, 193]) == (31, 119, 180)
    assert not changed[60:100, 50:140].any() and not changed[0:20].any()  # inside the boxes, and away from them


def test_the_gallery_draws_each_policys_box_and_the_legend_names_its_colour(shards):
    _, shards_dir, _ = shards
    env = envs.make("rec", shards_dir=str(shards_dir), split="test")
    records = {}
    for policy, answer in (("sft", "ideal"), ("grpo", "[0, 0, 100, 100]"), ("base", "no box")):
        records[policy] = []
        for i in range(len(env)):
            state, _ = env.reset(i)
            text = env.ideal_answer(state.meta) if answer == "ideal" else answer
            _, info = env.score(state, text)
            records[policy].append({"id": state.key, **RecEnv.record_fields(info, state.meta)})
    image = env.samples[0].images[0]
    by_policy = {policy: recs[0] for policy, recs in records.items()}
    [drawn] = RecEnv.gallery_images([image], by_policy)
    plain = np.asarray(rec_report.draw_boxes(image, None, [], max_px=THUMBNAIL_PX), np.int32)
    truth_only = np.asarray(rec_report.draw_boxes(image, by_policy["sft"]["truth"]["bbox_2d"], [],
                                                  max_px=THUMBNAIL_PX), np.int32)
    drawn = np.asarray(drawn, np.int32)
    assert rec_report.GALLERY_PX == THUMBNAIL_PX  # drawn at the size the gallery shows
    assert drawn.shape == plain.shape and max(drawn.shape[:2]) == THUMBNAIL_PX
    colours = rec_report.policy_colours(list(records))
    # grpo's box (0-100 of 1000) is drawn in grpo's colour at the top left; sft's lies on the truth's black
    corner = drawn[: THUMBNAIL_PX // 10, : THUMBNAIL_PX // 10]
    grpo_rgb = tuple(int(colours["grpo"][i:i + 2], 16) for i in (1, 3, 5))
    assert (np.abs(corner - grpo_rgb).sum(axis=2) == 0).any() and not (drawn == truth_only).all()
    # no record for a policy (None) draws nothing for it
    missing = np.asarray(RecEnv.gallery_images([image], {"sft": by_policy["sft"], "grpo": None, "base": None})[0],
                         np.int32)
    assert not (np.abs(missing[: THUMBNAIL_PX // 10, : THUMBNAIL_PX // 10] - grpo_rgb).sum(axis=2) == 0).any()
    legend = RecEnv.report_html(records, RecParams())
    for policy, colour in colours.items():
        assert f'<span style="color:{colour}">{policy}</span>' in legend


# --- the hub path, on a local parquet fixture -------------------------------------------------------


def _png(size, box, colour=(220, 30, 30)):
    image = Image.new("RGB", size, (240, 240, 240))
    image.paste(colour, tuple(int(v) for v in box))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("question_id", pa.string()),
                        ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("question", pa.string()), ("answer", pa.list_(pa.string())),
                        ("segmentation", pa.list_(pa.float32())), ("bbox", pa.list_(pa.float32())),
                        ("iscrowd", pa.int8()), ("file_name", pa.string())])
    columns = {name: [row.get(name) for row in rows] for name in schema.names}
    pq.write_table(pa.table(columns, schema=schema), path)


def _hub_row(qid, answer, bbox, image=None, size=(64, 48)):
    box = (bbox[0], bbox[1], bbox[0] + bbox[2], bbox[1] + bbox[3])
    return {"question_id": qid, "image": {"bytes": image if image is not None else _png(size, box), "path": None},
            "question": "Please carefully observe the area circled in the image and come up with a caption.",
            "answer": answer, "segmentation": [1.0, 2.0], "bbox": bbox, "iscrowd": 0, "file_name": f"{qid}.jpg"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    _write_parquet(tmp_path / "val.parquet", [
        _hub_row("101", ["the red box", "red thing"], [10.0, 8.0, 20.0, 16.0]),
        _hub_row("102", [], [1.0, 1.0, 5.0, 5.0]),                                  # no expression
        _hub_row("103", ["  ", "the second  one"], [40.0, 4.0, 16.0, 30.0]),       # the first non-empty
        _hub_row("104", ["flat"], [1.0, 2.0, 0.0, 5.0]),                           # zero width
        _hub_row("105", ["junk"], [1.0, 2.0, 3.0, 4.0], image=b"not an image"),
        _hub_row("101", ["again"], [1.0, 2.0, 3.0, 4.0]),                          # duplicate id
        _hub_row("106.5", ["over the edge"], [50.0, 40.0, 20.0, 20.0]),            # clipped to the image
        _hub_row("107", ["one too many"], [1.0, 1.0, 5.0, 5.0]),                   # beyond train_images
    ])
    _write_parquet(tmp_path / "test.parquet", [_hub_row("201", ["the box"], [0.0, 0.0, 32.0, 24.0], size=(640, 480))])
    calls = []

    def load(repo, split):
        calls.append((repo, split))
        return pq.read_table(tmp_path / f"{split}.parquet").to_pylist()

    monkeypatch.setattr(rec_data, "load_hub_split", load)
    return tmp_path, calls


def test_hub_rows_become_the_raw_layout_in_pixels(hub):
    root, calls = hub
    params = replace(SMALL, source="hub", train_images=4, test_images=5)
    counts = RecEnv.build_raw(params, root / "raw")
    assert calls == [("lmms-lab/RefCOCO", "val"), ("lmms-lab/RefCOCO", "test")]
    assert counts == {"train_samples": 4, "train_skipped_no_expression": 1, "train_skipped_bad_box": 1,
                      "train_skipped_bad_image": 1, "train_skipped_duplicate_id": 1, "test_samples": 1}
    rows, members = _read_raw(root / "raw", "train")
    assert [(r["id"], r["expression"], r["label"], r["box"], r["width"], r["height"]) for r in rows] == [
        ("101", "the red box", "the red box", "10.00 8.00 30.00 24.00", "64", "48"),
        ("103", "the second one", "the second one", "40.00 4.00 56.00 34.00", "64", "48"),
        ("106_5", "over the edge", "over the edge", "50.00 40.00 64.00 48.00", "64", "48"),
        ("107", "one too many", "one too many", "1.00 1.00 6.00 6.00", "64", "48")]
    image = Image.open(io.BytesIO(members["101.jpg"]))
    assert image.format == "JPEG" and image.size == (64, 48)
    assert np.abs(np.asarray(image.convert("RGB"))[16, 20].astype(int) - (220, 30, 30)).max() < 20
    assert parse_row(rows[0]).meta["bbox_2d"] == [156, 167, 469, 500]
    assert not (root / "raw" / "test_ood.csv").exists()


def test_hub_repo_setting_and_reading_stops_at_the_limit(tmp_path):
    pulled = []

    def stream(repo, split):
        for i in range(3):
            pulled.append((repo, split, i))
            yield _hub_row(f"{split}{i}", ["x"], [0.0, 0.0, 8.0, 8.0])

    counts = rec_data.download_hub_raw(replace(SMALL, source="hub", hub_repo="me/refcocog", train_images=2,
                                               test_images=1), tmp_path / "raw", load_fn=stream)
    assert counts == {"train_samples": 2, "test_samples": 1}
    # no row pulled past the limit
    assert pulled == [("me/refcocog", "val", 0), ("me/refcocog", "val", 1), ("me/refcocog", "test", 0)]


def test_hub_data_through_shards_to_the_env(hub):
    root, _ = hub
    params = replace(SMALL, source="hub", train_images=4, test_images=5)
    _, shards_dir, manifest = build_shards(root / "built", params, "rec")
    assert manifest["splits"]["test"]["kept"] == 1
    env = envs.make("rec", shards_dir=str(shards_dir), split="test")
    state, obs = env.reset(0)
    # the 640x480 photo was resized to the shard stage's 256x192; the truth is relative, so it still fits
    assert obs["images"][0].size == (256, 192) and state.meta["bbox_2d"] == [0, 0, 50, 50]
    assert env.step_text(state, env.ideal_answer(state.meta))[2] == 1.0


# --- tokenizer corpus ------------------------------------------------------------------------


def test_default_tokenizer_corpus_is_unchanged_by_rec():
    expected = [*envs.env_class("geospot").corpus(), *envs.env_class("nlvr2").corpus()]
    assert registry.TOKENIZER_ENVS == ("geospot", "nlvr2") and "rec" in registry.BUILTIN
    assert envs.corpus() == expected and envs.corpus("geospot") == expected
    with_rec = envs.corpus("rec")
    corpus = RecEnv.corpus()
    assert with_rec == expected + corpus and corpus == RecEnv.corpus()  # deterministic
    assert PROMPT.format(expression="") in corpus and PROMPT.format(expression="") not in expected
    assert any('"bbox_2d": [' in text for text in corpus) and any(" to the left of the " in t for t in corpus)


# --- through the pipeline's libraries ----------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return build_shards(tmp_path_factory.mktemp("pipeline"), replace(SMALL, image_width=256, image_height=192), "rec")


def test_env_serves_the_generated_samples_from_shards(shards):
    params, shards_dir, manifest = shards
    assert manifest["splits"]["test"]["kept"] == 6 and manifest["splits"]["test_ood"]["kept"] == 4
    env = envs.make("rec", shards_dir=str(shards_dir), split="test")
    expected = rec_data.generate_split(params.seed, "test", 6, 256, 192)
    assert len(env) == len(expected)
    for idx, sample in enumerate(expected):
        state, obs = env.reset(idx)
        assert state.meta["id"] == sample.id and state.meta["expression"] == sample.expression
        assert state.meta["bbox_2d"] == list(pixels_to_qwen(sample.box, 256, 192))
        assert obs["messages"][0]["content"][-1]["text"] == LABEL_FIRST_PROMPT.format(expression=sample.expression)
        assert len(obs["images"]) == 1 and obs["images"][0].size == (256, 192)
        assert env.step_text(state, env.ideal_answer(state.meta))[2] == 1.0
        assert env.step_text(state, "no idea")[2] == 0.0


def _colour_at(image, box):
    x1, y1, x2, y2 = qwen_to_pixels(box, *image.size)
    pixel = np.asarray(image)[int((y1 + y2) / 2), int((x1 + x2) / 2)].astype(int)
    return min(COLOURS, key=lambda name: np.abs(np.asarray(COLOURS[name]) - pixel).sum())


def test_truth_boxes_survive_the_shard_stage_resizing(tmp_path):
    RecEnv.write_synthetic(replace(SMALL, image_width=256, image_height=192, ood_images=0), tmp_path / "raw")
    shard_raw(tmp_path / "raw", tmp_path / "shards", RecEnv.schema, ShardParams(val_samples=0, max_pixels=96 * 72))
    env = envs.make("rec", shards_dir=str(tmp_path / "shards"), split="test")
    for idx in range(len(env)):
        state, obs = env.reset(idx)
        image = obs["images"][0]
        assert image.size == (96, 72)  # downscaled from 256x192
        # the box centre, in pixels of the smaller image, lands on the target's colour (every shape covers its
        # box's centre)
        assert _colour_at(image, state.meta["bbox_2d"]) == state.meta["label"].split()[1], state.meta


def test_registered_under_its_name():
    assert envs.env_class("rec") is RecEnv and RecEnv.name == "rec" and RecEnv.ood_note
