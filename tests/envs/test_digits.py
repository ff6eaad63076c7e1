"""The digits env: its generator (determinism, disjoint handwriting pools, the OOD shift), row schema, reward
(hand-worked cases and a fuzz test), metrics, the tokenizer corpus, and the env served from shards."""

from __future__ import annotations

import random
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from adversarial import TAGGED, adversarial, wordings
from shard_helpers import build_shards

from vlmgym import envs
from vlmgym.data import layout
from vlmgym.data.rows import RowSkip
from vlmgym.envs import registry
from vlmgym.envs.digits import DigitsEnv, read_integers, sort_credit
from vlmgym.envs.digits import data as digits_data
from vlmgym.envs.digits.env import PROMPTS, DigitsParams, parse_row
from vlmgym.params import DataParams, ParamsError
from vlmgym.stats.bootstrap import Statistic

SMALL = DataParams(source="synthetic", seed=3, train_images=8, test_images=6, ood_images=4,
                   image_width=128, image_height=96)


def _sample(task: str, digits: list[int]):
    from vlmgym.data.shards import Sample

    return Sample(key="k", images=[None], meta={"id": "k", "task": task, "digits": digits,
                                                "answer": digits_data.answer_text(task, digits)})


def _score(task: str, digits: list[int], text: str, weight: float = 0.1):
    env = DigitsEnv(samples=[_sample(task, digits)], params=DigitsParams(format_weight=weight))
    state, _ = env.reset(0)
    return env.score(state, text)


# --- generator ------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    DigitsEnv.write_synthetic(SMALL, root / "a")
    DigitsEnv.write_synthetic(SMALL, root / "b")
    return root


def test_generator_is_byte_identical_on_rerun(raw):
    files = sorted(p.relative_to(raw / "a") for p in (raw / "a").rglob("*") if p.is_file())
    assert {str(f) for f in files} >= {"train.csv", "test.csv", "test_ood.csv", "images/test/00.zip"}
    for f in files:
        assert (raw / "a" / f).read_bytes() == (raw / "b" / f).read_bytes(), f


def test_rendering_processes_do_not_change_a_byte(tmp_path):
    """Each image is seeded by its sample alone, so two rendering processes write what one does."""
    settings = digits_data.DigitsDataParams()
    samples = digits_data.generate_split(0, "train", 40, 96, 72, settings)
    for workers in (1, 2):
        digits_data.write_raw_split(tmp_path / str(workers), "train", samples, 0, 96, 72, settings, workers)
    files = sorted(p.relative_to(tmp_path / "1") for p in (tmp_path / "1").rglob("*") if p.is_file())
    assert [str(f) for f in files] == ["images/train/00.zip", "train.csv"]
    for f in files:
        assert (tmp_path / "1" / f).read_bytes() == (tmp_path / "2" / f).read_bytes(), f


def test_generator_rows_are_balanced_and_valid(raw):
    for split, count in (("train", 8), ("test", 6), ("test_ood", 4)):
        rows = [dict(zip(header, fields)) for _, header, fields in layout.iter_csv(layout.csv_path(raw / "a", split))]
        assert len(rows) == count and tuple(rows[0]) == digits_data.CSV_COLUMNS
        assert sum(r["task"] == "sort" for r in rows) == (count + 1) // 2
        for rec in rows:
            row = parse_row(rec)  # every written row passes the schema
            assert 1 <= len(row.meta["digits"]) <= 3
        with zipfile.ZipFile(layout.zip_dir(raw / "a", split) / "00.zip") as archive:
            assert sorted(archive.namelist()) == sorted(r["image"] for r in rows)


def test_train_and_test_pools_are_disjoint_and_used_as_such():
    train, test = set(digits_data.pool("train")), set(digits_data.pool("test"))
    assert not train & test and len(train | test) == 1797
    assert 0.15 < len(test) / 1797 < 0.25
    assert set(digits_data.pool("test_ood")) == test
    settings = digits_data.DigitsDataParams()
    for split, allowed in (("train", train), ("test", test), ("test_ood", test)):
        for sample in digits_data.generate_split(0, split, 40, 256, 192, settings):
            assert set(sample.scans) <= allowed
            labels = digits_data._scans()[1]
            assert list(sample.digits) == [int(labels[s]) for s in sample.scans]


def test_boxes_do_not_overlap_and_fit_even_a_small_canvas():
    settings = digits_data.DigitsDataParams(max_digits=4, min_scale=60, max_scale=64)
    for sample in digits_data.generate_split(1, "train", 30, 64, 48, settings):
        for i, (x, y, s, _) in enumerate(sample.boxes):
            assert x >= 0 and x + s <= 64 and y >= 0 and y + s <= 48
            for bx, by, bs, _ in sample.boxes[i + 1:]:
                assert x + s <= bx or bx + bs <= x or y + s <= by or by + bs <= y


def test_deterministic_per_seed_and_index():
    a = digits_data.generate_split(5, "test", 10, 256, 192)
    assert a == digits_data.generate_split(5, "test", 10, 256, 192)
    assert a != digits_data.generate_split(6, "test", 10, 256, 192)


def test_ood_inverts_colours():
    settings = digits_data.DigitsDataParams()
    sample = digits_data.generate_split(0, "test_ood", 1, 128, 96, settings)[0]
    ood = np.asarray(digits_data.render(sample, 0, "test_ood", 128, 96, settings), np.float64)
    normal = np.asarray(digits_data.render(sample, 0, "test", 128, 96, settings), np.float64)
    assert np.median(normal) > 180 and np.median(ood) < 75  # light paper in test, dark in test_ood
    # the digits themselves: the darkest pixels of test are the brightest of test_ood
    assert np.percentile(ood, 99.5) > 180 and np.percentile(normal, 0.5) < 100


def test_ood_rotate_turns_the_digits():
    settings = digits_data.DigitsDataParams(ood_shift="rotate")
    for sample in digits_data.generate_split(0, "test_ood", 10, 256, 192, settings):
        assert all(20 <= abs(angle) <= 40 for *_, angle in sample.boxes)
    assert all(angle == 0 for s in digits_data.generate_split(0, "test", 10, 256, 192, settings)
               for *_, angle in s.boxes)


def test_no_ood_split_without_ood_images(tmp_path):
    DigitsEnv.write_synthetic(replace(SMALL, ood_images=0), tmp_path)
    assert layout.present_splits(tmp_path) == ["train", "test"]


def test_settings_reject_an_empty_scale_range():
    with pytest.raises(ParamsError, match="max_scale 20 is below min_scale 30"):
        digits_data.DigitsDataParams(min_scale=30, max_scale=20)


# --- row schema -------------------------------------------------------------------


GOOD = {"id": "test-000001", "task": "sort", "digits": "7 1 3", "answer": "1, 3, 7", "image": "test-000001.jpg"}


def test_schema_parses_a_good_row():
    row = parse_row(GOOD)
    assert row.key == "test-000001" and row.images == ("test-000001.jpg",)
    assert row.meta == {"id": "test-000001", "task": "sort", "digits": [7, 1, 3], "answer": "1, 3, 7"}
    assert parse_row({**GOOD, "task": "sum", "answer": "11"}).meta["answer"] == "11"


@pytest.mark.parametrize(("change", "reason"), [
    ({"id": "a.b"}, "bad_id"),
    ({"task": "product"}, "bad_task"),
    ({"digits": ""}, "bad_digits"),
    ({"digits": "1 12"}, "bad_digits"),
    ({"digits": "1 x"}, "bad_digits"),
    ({"digits": "1 2 3 4 5"}, "bad_digits"),
    ({"answer": "7, 3, 1"}, "bad_answer"),
    ({"task": "sum", "answer": "12"}, "bad_answer"),
    ({"image": ""}, "image_missing"),
])
def test_schema_skips_bad_rows_with_a_reason(change, reason):
    with pytest.raises(RowSkip) as err:
        DigitsEnv.schema.row({**GOOD, **change})
    assert err.value.reason == reason


# --- reward -------------------------------------------------------------------------


@pytest.mark.parametrize(("task", "digits"), [("sort", [7, 1, 3]), ("sum", [7, 1, 3]), ("sort", [0]), ("sum", [9, 9])])
def test_ideal_answer_scores_one(task, digits):
    answer = DigitsEnv.ideal_answer({"task": task, "digits": digits})
    assert answer == {"sort": {3: "1, 3, 7", 1: "0", 2: "9, 9"}, "sum": {3: "11", 2: "18"}}[task][len(digits)]
    reward, info = _score(task, digits, answer)
    assert reward == 1.0 and info["format_ok"] and info["exact"]
    assert info["reward_components"] == pytest.approx({"format": 0.1, "correct": 0.9})


@pytest.mark.parametrize(("text", "credit", "format_ok"), [
    ("1, 3, 7", 1.0, True),
    ("1 3 7", 1.0, True),          # spaces are a list too
    ("  1,3,7. ", 1.0, True),      # surrounding whitespace and a trailing full stop
    ("1, 3", 2 / 3, True),         # a digit missing
    ("1, 3, 7, 8", 3 / 4, True),   # one extra
    ("1, 7, 3", 1 / 3, True),      # two swapped: only the first in place
    ("7, 3, 1", 1 / 3, True),      # wrong order: the middle one matches
    ("3, 7", 0.0, True),           # shifted: nothing in place
    ("The digits are 1, 3, 7", 0.0, False),  # right, but more than the list: not read
    ("1, 3, 17", 0.0, False),      # not single digits
    ("1,, 3, 7", 0.0, False),      # malformed list
    ("1, 3, 7, 8, 9", 0.0, False),  # more digits than a canvas holds (MAX_DIGITS)
    ("١, ٣, ٧", 0.0, False),       # Arabic-Indic digits: not the expected ASCII shape
    ("", 0.0, False),
])
def test_sort_partial_credit_by_hand(text, credit, format_ok):
    reward, info = _score("sort", [7, 1, 3], text)
    assert info["correctness"] == pytest.approx(credit) and info["format_ok"] is format_ok
    assert reward == pytest.approx(0.1 * format_ok + 0.9 * credit)
    assert info["exact"] is (credit == 1.0)


@pytest.mark.parametrize(("text", "correct", "format_ok"), [
    ("11", True, True), (" 11. ", True, True), ("+11", True, True), ("12", False, True), ("-11", False, True),
    ("1 + 3 + 7 = 11", False, False), ("11 or 12", False, False), ("eleven", False, False), ("", False, False),
    ("١١", False, False),  # Arabic-Indic digits: int() reads 11, but the expected shape is ASCII
    ("011", False, False),  # more digits than a sum of MAX_DIGITS digits has
])
def test_sum_by_hand(text, correct, format_ok):
    reward, info = _score("sum", [7, 1, 3], text)
    assert info["format_ok"] is format_ok and info["exact"] is correct
    assert reward == pytest.approx(0.1 * format_ok + 0.9 * correct)


def test_format_weight_is_the_env_setting():
    assert _score("sum", [7, 1, 3], "12", weight=0.5)[0] == 0.5
    assert _score("sum", [7, 1, 3], "11", weight=0.0)[0] == 1.0
    assert _score("sort", [7, 1, 3], "1 3", weight=0.0)[0] == pytest.approx(2 / 3)


def test_garbage_scores_zero():
    for text in ("\x00 perhaps {{", "I cannot tell.", "no digits here", "-", ",,,,"):
        for task in ("sort", "sum"):
            reward, info = _score(task, [7, 1, 3], text)
            assert reward == 0.0 and not info["format_ok"] and info["parse_failed"], (task, text)


def test_integers_read_robustly():
    assert read_integers("1, -2, +3, ٣") == [1, -2, 3, 3]
    assert read_integers("9" * 5000) == [None]  # no int() of a 5,000-digit string (Python refuses > 4,300)
    assert read_integers("-0") == [0] and read_integers("") == [] and read_integers(None) == []
    assert sort_credit([], []) == 0.0 and sort_credit([None, 3], [1, 3]) == 0.5


def _adversarial(rng: random.Random) -> str:
    kind = rng.randrange(10)
    if kind == 0:
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(40))).encode(
            "utf-8", "replace").decode("utf-8", "replace")
    if kind == 1:
        return rng.choice(("-", "+", "")) + "1" + "0" * rng.randrange(6000)  # a huge integer, beyond int()'s limit
    if kind == 2:
        return "," * rng.randrange(1000) + str(rng.randrange(10))
    if kind == 3:
        return "\n".join(str(rng.randrange(10)) for _ in range(rng.randrange(50)))
    if kind == 4:
        return rng.choice(("-0", "+0", "-", "+", "0x11", "1e3", "11.0", "½", "²", "٣", "①", "1_1", "NaN", "inf"))
    if kind == 5:
        return "1, 3, 7 " * rng.randrange(2000)
    if kind == 6:
        return "".join(rng.choice("0123456789, .-+\n\t") for _ in range(rng.randrange(60)))
    if kind == 7:
        return "".join(rng.choice("٠١٢٣٤٥٦٧٨٩०१२३४५६७८९0123456789") for _ in range(rng.randrange(30)))
    if kind == 8:
        return "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(80)))
    return "\ud800" + str(rng.randrange(100))  # a lone surrogate, as a broken decode can leave


def test_score_never_raises_and_stays_in_range():
    rng = random.Random(0)
    samples = [_sample(task, digits) for task in ("sort", "sum") for digits in ([0], [7, 1, 3], [9, 9, 9])]
    env = DigitsEnv(samples=samples)
    states = [env.reset(i)[0] for i in range(len(samples))]
    for i in range(10_000):
        text = _adversarial(rng)
        reward, info = env.score(states[i % len(states)], text)
        assert 0.0 <= reward <= 1.0, (text[:80], reward)
        assert isinstance(info["format_ok"], bool) and set(info["reward_components"]) == {"format", "correct"}
        assert len(info["numbers"]) <= 32
        assert info["format_ok"] or reward == 0.0  # no credit outside the format


DIGITS_JUNK = [*adversarial("digits"), *(tagged(t) for t in ("1, 3, 7", "11", "3") for tagged in TAGGED),
               "The digits are 1, 3, 7", "1 + 3 + 7 = 11", "sum: 11", "3 (three)", "[1, 3, 7]", "1, 3, 7, 1, 3, 7",
               # the right answers negated, hedged or beside a wrong one
               *wordings("1, 3, 7", "7, 3, 1"), *wordings("11", "12"), *wordings("3", "4")]


@pytest.mark.parametrize("task", ["sort", "sum"])
def test_answers_not_in_the_format_score_zero(task):
    """Digits in JSON, tags, prose, spam or other scripts earn neither the format nor the correctness share, even
    where they spell the truth (1, 3, 7 sorted is 1, 3, 7; their sum is 11; ٣ is 3)."""
    samples = [_sample(task, digits) for digits in ([7, 1, 3], [3], [0], [9, 9, 9], [5, 0, 0, 5])]
    env = DigitsEnv(samples=samples)
    states = [env.reset(i)[0] for i in range(len(samples))]
    other = "11" if task == "sort" else "1, 3, 7"  # the other task's answer
    for text in [*DIGITS_JUNK, other]:
        for state in states:
            reward, info = env.score(state, text)
            assert reward == 0.0 and info["correctness"] == 0.0, (task, state.meta["digits"], text[:80])
            assert info["reward_components"] == {"format": 0.0, "correct": 0.0} and not info["format_ok"]
            assert info["answer"] is None and not info["exact"]


# --- metrics --------------------------------------------------------------------------


def _record(task, digits, predicted):
    return {"id": "x", "pred_answer": predicted,
            "truth": {"task": task, "digits": digits, "answer": digits_data.answer_text(task, digits)}}


def test_metrics_by_task_and_digit_count():
    records = [_record("sort", [3, 1], "1, 3"), _record("sort", [2], "3"), _record("sum", [4, 5, 6], "15"),
               _record("sum", [1, 1, 1], None), _record("sum", [5], "5")]
    stats = DigitsEnv.task_statistics(records)
    points = {name: stat.point() for name, stat in stats.items()}
    assert points == pytest.approx({"accuracy": 3 / 5, "accuracy_sort": 1 / 2, "accuracy_sum": 2 / 3,
                                    "accuracy_1digit": 1 / 2, "accuracy_2digit": 1.0, "accuracy_3digit": 1 / 2})
    assert all(isinstance(s, Statistic) for s in stats.values())
    assert set(stats) <= set(DigitsEnv.metric_rows)  # each has a table row; 4-digit absent here, so left out
    assert DigitsEnv.usable_prediction(records[0]) and not DigitsEnv.usable_prediction(records[3])
    with pytest.raises(ValueError, match="record 0 .*truth.task"):
        DigitsEnv.task_statistics([{"id": "x", "pred_answer": "1", "truth": {"task": "product", "digits": [1]}}])


def test_record_fields_and_gallery_text():
    _, info = _score("sort", [7, 1, 3], "1, 7, 3")
    fields = DigitsEnv.record_fields(info, _sample("sort", [7, 1, 3]).meta)
    assert fields["pred_answer"] == "1, 7, 3" and fields["parsed"]["numbers"] == [1, 7, 3]
    assert fields["truth"] == {"task": "sort", "digits": [7, 1, 3], "answer": "1, 3, 7"}
    assert DigitsEnv.truth_text(fields["truth"]) == "sort of 7 1 3 -> 1, 3, 7"
    assert DigitsEnv.outcome_text(fields) == "partial 0.33"
    assert DigitsEnv.outcome_text({**fields, "pred_answer": "1, 3, 7"}) == "correct"


# --- tokenizer corpus ------------------------------------------------------------------


def test_default_tokenizer_corpus_is_unchanged_by_digits():
    expected = [*envs.env_class("geospot").corpus(), *envs.env_class("nlvr2").corpus()]
    assert registry.TOKENIZER_ENVS == ("geospot", "nlvr2") and "digits" in registry.BUILTIN
    assert envs.corpus() == expected and envs.corpus("geospot") == expected
    with_digits = envs.corpus("digits")
    assert with_digits == expected + DigitsEnv.corpus()
    assert {"1, 2, 3", "27", *PROMPTS.values()} <= set(with_digits) and not set(PROMPTS.values()) & set(expected)


# --- through the pipeline's libraries ----------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return build_shards(tmp_path_factory.mktemp("pipeline"), SMALL, "digits")


def test_env_serves_the_generated_samples_from_shards(shards):
    params, shards_dir, manifest = shards
    assert manifest["splits"]["test"]["kept"] == 6 and manifest["splits"]["test_ood"]["kept"] == 4
    env = envs.make("digits", shards_dir=str(shards_dir), split="test")
    expected = digits_data.generate_split(params.seed, "test", 6, params.image_width, params.image_height)
    assert len(env) == len(expected)
    for idx, sample in enumerate(expected):
        state, obs = env.reset(idx)
        assert state.meta["id"] == sample.id and state.meta["digits"] == list(sample.digits)
        assert obs["messages"][0]["content"][-1]["text"] == PROMPTS[sample.task]
        assert len(obs["images"]) == 1 and obs["images"][0].size == (params.image_width, params.image_height)
        assert env.step_text(state, env.ideal_answer(state.meta))[2] == 1.0
        assert env.step_text(state, "no idea")[2] == 0.0


def test_registered_under_its_name():
    assert envs.env_class("digits") is DigitsEnv and DigitsEnv.name == "digits" and DigitsEnv.ood_note


def test_tasks_leave_the_other_question_out_of_every_split():
    samples = DigitsEnv.generate(12, seed=3, split="test")  # balanced: 6 of each
    for asked in (("sort",), ("sum",)):
        env = DigitsEnv(samples=samples, params=DigitsParams(tasks=asked))
        assert len(env) == 6 and {s.meta["task"] for s in env.samples} == set(asked)
        assert env.reset(0)[1]["messages"][-1]["content"][-1]["text"] == PROMPTS[asked[0]]
    assert len(DigitsEnv(samples=samples)) == 12  # both, by default
    with pytest.raises(ValueError, match=r"no sample of tasks \['sum'\]"):
        DigitsEnv(samples=[s for s in samples if s.meta["task"] == "sort"], params=DigitsParams(tasks=("sum",)))
    with pytest.raises(ParamsError, match="env.digits.tasks"):
        DigitsParams(tasks=())
