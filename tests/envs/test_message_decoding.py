"""The message_decoding env: its generator (determinism, disjoint word pools, the code, the OOD shifts), row schema,
reward (hand-worked cases and a fuzz test), metrics by word length, the tokenizer corpus, and the env served from
shards."""

from __future__ import annotations

import io
import random
import string
import zipfile
from dataclasses import replace

import numpy as np
import pytest
from adversarial import TAGGED, adversarial, wordings
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from shard_helpers import build_shards

from vlmgym import envs
from vlmgym.data import layout
from vlmgym.data.rows import RowSkip
from vlmgym.envs import registry
from vlmgym.envs.message_decoding import MessageDecodingEnv, char_credit, read_word
from vlmgym.envs.message_decoding import data as md_data
from vlmgym.envs.message_decoding.env import (
    PAIRS_PROMPT,
    PROMPT,
    SPACED_PROMPT,
    MessageDecodingParams,
    length_group,
    parse_row,
    spell,
)
from vlmgym.envs.message_decoding.render import render_table
from vlmgym.params import DataParams, ParamsError, load_all
from vlmgym.stats.bootstrap import Statistic

SMALL = DataParams(source="synthetic", seed=3, train_images=8, test_images=6, ood_images=4,
                   image_width=128, image_height=96)
DEFAULTS = md_data.MessageDecodingDataParams()
DECODER = "qwertyuiopasdfghjklzxcvbnm"  # coded a -> plain q, b -> w, ...


def _sample(word: str, decoder: str = DECODER):
    from vlmgym.data.shards import Sample

    return Sample(key="k", images=[None], meta={"id": "k", "coded": md_data.encode(word, decoder), "decoder": decoder,
                                                "answer": word})


def _score(word: str, text: str, weight: float = 0.1, letters: str = "word"):
    env = MessageDecodingEnv(samples=[_sample(word)], params=MessageDecodingParams(format_weight=weight,
                                                                                   letters=letters))
    state, _ = env.reset(0)
    return env.score(state, text)


# --- generator ------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    root = tmp_path_factory.mktemp("message_decoding")
    MessageDecodingEnv.write_synthetic(SMALL, root / "a")
    MessageDecodingEnv.write_synthetic(SMALL, root / "b")
    return root


def _rows(root, split):
    return [dict(zip(header, fields)) for _, header, fields in layout.iter_csv(layout.csv_path(root, split))]


def test_generator_is_byte_identical_on_rerun(raw):
    files = sorted(p.relative_to(raw / "a") for p in (raw / "a").rglob("*") if p.is_file())
    assert {str(f) for f in files} >= {"train.csv", "test.csv", "test_ood.csv", "images/test/00.zip"}
    for f in files:
        assert (raw / "a" / f).read_bytes() == (raw / "b" / f).read_bytes(), f


def test_rows_are_valid_and_each_image_is_the_rows_table(raw):
    for split, count in (("train", 8), ("test", 6), ("test_ood", 4)):
        rows = _rows(raw / "a", split)
        assert len(rows) == count and tuple(rows[0]) == md_data.CSV_COLUMNS
        samples = md_data.generate_split(SMALL.seed, split, count)
        with zipfile.ZipFile(layout.zip_dir(raw / "a", split) / "00.zip") as archive:
            assert sorted(archive.namelist()) == sorted(r["image"] for r in rows)
            for rec, sample in zip(rows, samples):
                row = parse_row(rec)  # every written row passes the schema
                assert row.meta["answer"] == sample.word and row.meta["decoder"] == sample.decoder
                drawn = archive.read(rec["image"])
                assert drawn == layout.encode_jpeg(render_table(sample.decoder, sample.columns, 128, 96))
                assert Image.open(io.BytesIO(drawn)).size == (128, 96)


def test_the_table_is_a_permutation_that_decodes_the_message():
    for split in ("train", "test", "test_ood"):
        for sample in md_data.generate_split(0, split, 50):
            assert sorted(sample.decoder) == list(string.ascii_lowercase)
            assert sorted(sample.columns) == list(string.ascii_lowercase)
            # decoding letter by letter with the table, as the image shows it: coded letter -> plain letter
            table = dict(zip(string.ascii_lowercase, sample.decoder))
            assert "".join(table[c] for c in sample.coded) == sample.word
            assert md_data.decode(sample.coded, sample.decoder) == sample.word
            assert len(sample.coded) == len(sample.word)
    # the codes differ from sample to sample
    assert len({s.decoder for s in md_data.generate_split(0, "train", 50)}) == 50


def test_train_and_test_words_are_disjoint():
    train, test = set(md_data.pool("train", DEFAULTS)), set(md_data.pool("test", DEFAULTS))
    ood = set(md_data.pool("test_ood", DEFAULTS))
    assert not train & test and not train & ood and not test & ood
    assert all(not md_data.in_test_pool(w) for w in train) and all(md_data.in_test_pool(w) for w in test | ood)
    assert 0.15 < len(test) / len(train | test) < 0.25
    assert all(3 <= len(w) <= 8 for w in train | test) and all(9 <= len(w) <= 10 for w in ood)
    for split, allowed in (("train", train), ("test", test), ("test_ood", ood)):
        assert {s.word for s in md_data.generate_split(0, split, 100)} <= allowed
    # the pools are the hash's alone: another list size or length keeps every word on its side
    wider = md_data.MessageDecodingDataParams(words=10_000, min_length=2, max_length=12)
    assert train <= set(md_data.pool("train", wider)) and not train & set(md_data.pool("test", wider))


def test_words_are_common_lowercase_english():
    words = md_data.vocabulary(5000)
    assert len(words) == len(set(words)) > 4000 and all(w.isascii() and w.isalpha() and w.islower() for w in words)
    assert words[:3] == ("the", "to", "and")


def test_deterministic_per_seed_and_index():
    a = md_data.generate_split(5, "test", 10)
    assert a == md_data.generate_split(5, "test", 10)
    assert a != md_data.generate_split(6, "test", 10)
    assert md_data.generate_split(5, "test", 3) == a[:3]


def test_word_tables_draw_only_the_coded_words_cells():
    """table: word fills the cells of the coded word's letters alone; the words, codes and cell order are those of
    table: full, so the two settings differ in the images and the drawn column only."""
    word_tables = md_data.MessageDecodingDataParams(table="word")
    full, words = md_data.generate_split(0, "train", 20), md_data.generate_split(0, "train", 20, word_tables)
    for a, b in zip(full, words):
        assert a.drawn == "" and b.drawn == "".join(sorted(set(b.coded)))
        assert (a.word, a.decoder, a.columns) == (b.word, b.decoder, b.columns)
    sample = words[0]
    image = np.asarray(render_table(sample.decoder, sample.columns, 288, 96, sample.drawn))
    assert not np.array_equal(image, np.asarray(render_table(sample.decoder, sample.columns, 288, 96)))
    # an empty cell is the full table's cell without its letters: the band and the rules are drawn alike
    empty = next(i for i, letter in enumerate(string.ascii_lowercase) if letter not in sample.drawn)
    blank = np.asarray(render_table(sample.decoder, sample.columns, 288, 96, "z" if empty != 25 else "a"))
    row, col = divmod(empty, 9)
    cell = (slice(int(4 + row * 29.4) + 3, int(4 + (row + 1) * 29.4) - 3), slice(int(11.5 + col * 29.4) + 3,
                                                                            int(11.5 + (col + 1) * 29.4) - 3))
    assert np.array_equal(image[cell], blank[cell])


def test_word_tables_label_only_the_drawn_cells():
    env = MessageDecodingEnv.__new__(MessageDecodingEnv)
    meta = {"coded": "piglc", "decoder": DECODER, "answer": "house", "drawn": "cgilp"}
    labels = env.perception_labels(meta)
    assert [i for i, label in enumerate(labels) if label] == [2, 6, 8, 11, 15]
    assert labels[15] == 1 + ord("h") - ord("a")
    tokens = env.perception_token_labels(meta, 3, 9)
    assert [i for i, (coded, plain) in enumerate(tokens) if coded] == [2, 6, 8, 11, 15]
    assert tokens[15] == [16, 1 + ord("h") - ord("a")] and all(t == [0, 0] for t in tokens[16:])


def test_the_warm_up_sees_a_word_tables_whole_table():
    """perception_view draws a word table's sample again as its whole table (through the generator's JPEG) and
    labels all 26 cells; a whole table's sample is left as it is."""
    env = MessageDecodingEnv.__new__(MessageDecodingEnv)
    sample = md_data.generate_split(0, "train", 1, md_data.MessageDecodingDataParams(table="word"))[0]
    shown = render_table(sample.decoder, sample.columns, 288, 96, sample.drawn)
    meta = {"coded": sample.coded, "decoder": sample.decoder, "answer": sample.word, "drawn": sample.drawn}
    image, seen = env.perception_view(shown, meta)
    whole = Image.open(io.BytesIO(layout.encode_jpeg(render_table(sample.decoder, sample.columns, 288, 96))))
    assert np.array_equal(np.asarray(image), np.asarray(whole.convert("RGB")))
    assert seen == {**meta, "drawn": ""} and meta["drawn"] == sample.drawn
    assert sum(1 for coded, _ in env.perception_token_labels(seen, 3, 9) if coded) == 26
    assert all(env.perception_labels(seen))
    del meta["drawn"]
    assert env.perception_view(shown, meta) == (shown, meta)


def test_ood_long_words_and_shuffled_tables():
    assert all(s.columns == string.ascii_lowercase for split in ("train", "test", "test_ood")
               for s in md_data.generate_split(0, split, 20))
    assert all(len(s.word) in (9, 10) for s in md_data.generate_split(0, "test_ood", 20))
    shuffled = md_data.MessageDecodingDataParams(ood_shift="shuffled")
    ood = md_data.generate_split(0, "test_ood", 20, shuffled)
    assert all(s.columns != string.ascii_lowercase and 3 <= len(s.word) <= 8 for s in ood)
    assert all(s.columns == string.ascii_lowercase for s in md_data.generate_split(0, "test", 20, shuffled))
    image = np.asarray(render_table(ood[0].decoder, ood[0].columns, 256, 192))
    assert not np.array_equal(image, np.asarray(render_table(ood[0].decoder, string.ascii_lowercase, 256, 192)))


def test_no_ood_split_without_ood_images(tmp_path):
    MessageDecodingEnv.write_synthetic(replace(SMALL, ood_images=0), tmp_path)
    assert layout.present_splits(tmp_path) == ["train", "test"]


def test_settings_reject_empty_ranges():
    with pytest.raises(ParamsError, match="max_length 4 is below min_length 5"):
        md_data.MessageDecodingDataParams(min_length=5, max_length=4)
    with pytest.raises(ValueError, match="no test word of 12-12 letters"):
        md_data.pool("test", md_data.MessageDecodingDataParams(words=100, min_length=12, max_length=12))


def test_params_files_take_the_envs_sections(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("env:\n  name: message_decoding\n  message_decoding:\n    format_weight: 0.2\n"
                    "data:\n  message_decoding:\n    max_length: 7\n    ood_shift: shuffled\n")
    sections = load_all(path)
    assert sections["env"].settings() == MessageDecodingParams(format_weight=0.2)
    assert sections["data"].sections["message_decoding"] == md_data.MessageDecodingDataParams(
        max_length=7, ood_shift="shuffled")
    path.write_text("data:\n  message_decoding:\n    ood_shift: fog\n")
    with pytest.raises(ParamsError, match="data.message_decoding.ood_shift"):
        load_all(path)


# --- row schema -------------------------------------------------------------------


GOOD = {"id": "test-000001", "coded": md_data.encode("house", DECODER), "decoder": DECODER, "answer": "house",
        "image": "test-000001.jpg"}


def test_schema_parses_a_good_row():
    row = parse_row(GOOD)
    assert GOOD["coded"] == "piglc"  # plain h sits under coded p, o under i, u under g, s under l, e under c
    assert row.key == "test-000001" and row.images == ("test-000001.jpg",)
    assert row.meta == {"id": "test-000001", "coded": "piglc", "decoder": DECODER, "answer": "house"}
    # the optional drawn column: empty or absent draws the whole table, else it lands in meta
    assert parse_row({**GOOD, "drawn": ""}).meta == row.meta
    assert parse_row({**GOOD, "drawn": "cgilpz"}).meta == {**row.meta, "drawn": "cgilpz"}


@pytest.mark.parametrize(("change", "reason"), [
    ({"id": "a.b"}, "bad_id"),
    ({"decoder": DECODER[:-1]}, "bad_decoder"),
    ({"decoder": DECODER[:-1] + "q"}, "bad_decoder"),  # q twice, m missing
    ({"decoder": DECODER.upper()}, "bad_decoder"),
    ({"coded": ""}, "bad_coded"),
    ({"coded": "js mlc"}, "bad_coded"),
    ({"coded": "JSMLC"}, "bad_coded"),
    ({"coded": "a" * 15}, "bad_coded"),
    ({"answer": "horse"}, "bad_answer"),
    ({"answer": ""}, "bad_answer"),
    ({"image": ""}, "image_missing"),
    ({"drawn": "cgil"}, "bad_drawn"),  # p, a letter of the coded word, has no cell
    ({"drawn": "pligc"}, "bad_drawn"),  # not sorted
    ({"drawn": "cgillp"}, "bad_drawn"),
    ({"drawn": "CGILP"}, "bad_drawn"),
    ({"drawn": "cg ilp"}, "bad_drawn"),
])
def test_schema_skips_bad_rows_with_a_reason(change, reason):
    with pytest.raises(RowSkip) as err:
        MessageDecodingEnv.schema.row({**GOOD, **change})
    assert err.value.reason == reason


# --- reward -------------------------------------------------------------------------


@pytest.mark.parametrize("letters", ["word", "spaced", "pairs"])
@pytest.mark.parametrize("word", ["the", "house", "stopped", "something"])
def test_ideal_answer_scores_one(word, letters):
    env = MessageDecodingEnv(samples=[_sample(word)], params=MessageDecodingParams(letters=letters))
    sample = _sample(word)
    answer = env.ideal_answer(sample.meta)
    assert answer == {"word": word, "spaced": " ".join(word),
                      "pairs": " ".join(f"{c}={p}" for c, p in zip(sample.meta["coded"], word))}[letters]
    reward, info = _score(word, answer, letters=letters)
    assert info["answer"] == word
    assert reward == 1.0 and info["format_ok"] and info["exact"]
    assert info["reward_components"] == pytest.approx({"format": 0.1, "correct": 0.9})


@pytest.mark.parametrize(("text", "credit", "format_ok"), [
    ("house", 1.0, True),
    ("HOUSE", 1.0, True),            # case-insensitive
    ("  house. ", 1.0, True),        # surrounding whitespace and a final full stop
    ('"house"', 1.0, True),          # quoted
    ("“House”.", 1.0, True),
    ("hose", 2 / 5, True),           # a letter missing: h, o in place, then shifted
    ("houses", 5 / 6, True),         # one extra
    ("mouse", 4 / 5, True),          # one wrong
    ("huose", 3 / 5, True),          # two swapped: h, s, e in place
    ("esuoh", 1 / 5, True),          # reversed: only the middle u in place
    ("ouse", 0.0, True),             # shifted: nothing in place
    ("housexxxxxxxxx", 5 / 14, True),  # padding does not pay
    ("housexxxxxxxxxxxxxxx", 0.0, False),  # longer than any answer (MAX_ANSWER letters): not a word of the task
    ("The word is house.", 0.0, False),      # more than one word: not read
    ("house house", 0.0, False),
    ("house, or mouse", 0.0, False),
    ("<answer>house</answer>", 0.0, False),  # tags: not read
    ("hôuse", 0.0, False),           # another script's letter: not a-z
    ("hou5e", 0.0, False),           # a digit splits the word: "e" is read
    ("h o u s e", 0.0, False),       # spaced letters: "e" is read
    ("", 0.0, False),
])
def test_partial_credit_by_hand(text, credit, format_ok):
    reward, info = _score("house", text)
    assert info["correctness"] == pytest.approx(credit) and info["format_ok"] is format_ok
    assert reward == pytest.approx(0.1 * format_ok + 0.9 * credit)
    assert info["exact"] is (credit == 1.0)


@pytest.mark.parametrize(("text", "credit", "format_ok"), [
    ("h o u s e", 1.0, True),
    ("H O U S E.", 1.0, True),
    ('"h o u s e"', 1.0, True),
    ("h o s e", 2 / 5, True),
    ("m o u s e", 4 / 5, True),
    ("h", 1 / 5, True),              # a one-letter word is just the letter
    ("house", 0.0, False),           # the unspaced word is not the spaced format
    ("h  o u s e", 0.0, False),      # one space between letters, no more
    ("h o u s e h o u s e h o u s e", 0.0, False),  # longer than any answer
    ("ho us e", 0.0, False),
    ("h-o-u-s-e", 0.0, False),
    ("<answer>h o u s e</answer>", 0.0, False),
    ("The word is h o u s e.", 0.0, False),
])
def test_spaced_answers_by_hand(text, credit, format_ok):
    reward, info = _score("house", text, letters="spaced")
    assert info["correctness"] == pytest.approx(credit) and info["format_ok"] is format_ok
    assert reward == pytest.approx(0.1 * format_ok + 0.9 * credit)
    assert info["answer"] == (text.strip('".').replace(" ", "").lower() if format_ok else None)


@pytest.mark.parametrize(("text", "read", "credit"), [
    ("a=h b=o c=u d=s e=e", "house", 1.0),  # the word is the plain letters, whatever the coded ones
    ("A=H B=O C=U D=S E=E.", "house", 1.0),
    ("x=h x=o x=s x=e", "hose", 2 / 5),
    ("a=m b=o c=u d=s e=e", "mouse", 4 / 5),
    ("q=h", "h", 1 / 5),
    ("house", None, 0.0),               # the other forms read no word
    ("h o u s e", None, 0.0),
    ("a=h b=o c=u d=s e=e house", None, 0.0),
    ("a=h  b=o", None, 0.0),
    ("a=ho b=u", None, 0.0),
    ("a=h, b=o", None, 0.0),
    ("=h =o", None, 0.0),
    (" ".join(["a=h"] * 15), None, 0.0),  # longer than any answer
])
def test_pairs_answers_by_hand(text, read, credit):
    reward, info = _score("house", text, letters="pairs")
    assert info["answer"] == read and info["format_ok"] is (read is not None)
    assert info["correctness"] == pytest.approx(credit)
    assert reward == pytest.approx(0.1 * (read is not None) + 0.9 * credit)


def test_prompts_of_each_letters_form():
    sample = _sample("house")
    coded = sample.meta["coded"]
    expected = {"word": PROMPT.format(coded=coded), "spaced": SPACED_PROMPT.format(coded=spell(coded)),
                "pairs": PAIRS_PROMPT.format(coded=spell(coded))}
    for letters, prompt in expected.items():
        env = MessageDecodingEnv(samples=[sample], params=MessageDecodingParams(letters=letters))
        assert env.prompt(sample) == prompt
    assert f'"{" ".join(coded)}"' in expected["pairs"]


def test_format_weight_is_the_env_setting():
    assert _score("house", "horse", weight=0.5)[0] == pytest.approx(0.5 + 0.5 * 4 / 5)
    assert _score("house", "house", weight=0.0)[0] == 1.0
    assert _score("house", "The word is house", weight=1.0)[0] == 0.0


def test_garbage_scores_zero():
    for text in ("", "   ", "\x00 {{", "12345", "!!!", "٣٤", "🙂🙂", "...", "\ud800", "-- 42 --"):
        reward, info = _score("house", text)
        assert reward == 0.0 and not info["format_ok"] and info["parse_failed"] and info["answer"] is None, text


def test_words_read_robustly():
    assert read_word("The word is HOUSE.") == ("house", 4)
    assert read_word("a" * 64) == ("a" * 64, 1) and read_word("a" * 65) == (None, 1)  # too long to be an answer
    assert read_word("") == (None, 0) and read_word(None) == (None, 0) and read_word("1_2") == (None, 0)
    assert char_credit(None, "house") == 0.0 and char_credit("", "house") == 0.0 and char_credit("h", "") == 0.0
    too_long = _score("house", "house" + "x" * 60)  # 65 letters: neither read nor well-formed
    assert too_long[0] == 0.0 and not too_long[1]["format_ok"]


def _adversarial(rng: random.Random) -> str:
    kind = rng.randrange(12)
    if kind == 0:  # any code points (surrogates made replacement characters)
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(40))).encode(
            "utf-8", "replace").decode("utf-8", "replace")
    if kind == 1:  # a huge word, or huge whitespace around one
        return rng.choice(("house", "x", "")) * rng.randrange(40_000) + rng.choice(("", " ", "."))
    if kind == 2:
        return " " * rng.randrange(50_000) + rng.choice(("house", "'house'.", "h"))
    if kind == 3:  # many words
        return " ".join(rng.choice(("house", "the", "mouse", "HOUSE", "é", "ß")) for _ in range(rng.randrange(5000)))
    if kind == 4:
        return "".join(rng.choice(string.digits + " .,-") for _ in range(rng.randrange(60)))
    if kind == 5:
        return rng.choice(("", " ", ".", '"', "''", "“”", "house..", '"house', "İ", "ǅ", "ﬀ", "K", "\u200b",
                           "house\u0301", "\ud800", "\x00", "NaN", "٣"))
    if kind == 6:  # letters of other scripts
        return "".join(rng.choice("αβγабвあいう漢字ابةéüßİı") for _ in range(rng.randrange(30)))
    if kind == 7:
        return "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(80)))
    if kind == 8:  # near misses of the truth
        word = list("house")
        rng.shuffle(word)
        return "".join(word)[: rng.randrange(6)] + rng.choice(("", "s", ".", " "))
    if kind == 9:
        return "\n".join(rng.choice(("house", "", "1", "\t")) for _ in range(rng.randrange(200)))
    if kind == 10:  # combining marks and zero-width characters between letters
        return "h\u0301o\u200bu\u0308se" * rng.randrange(1, 5)
    return "\ud800" + "house" * rng.randrange(3)  # a lone surrogate, as a broken decode can leave


@pytest.mark.parametrize("letters", ["word", "spaced", "pairs"])
def test_score_never_raises_and_stays_in_range(letters):
    rng = random.Random(0)
    samples = [_sample(word) for word in ("the", "house", "something")]
    env = MessageDecodingEnv(samples=samples, params=MessageDecodingParams(letters=letters))
    states = [env.reset(i)[0] for i in range(len(samples))]
    for i in range(10_000):
        text = _adversarial(rng)
        reward, info = env.score(states[i % len(states)], text)
        assert 0.0 <= reward <= 1.0, (text[:80], reward)
        assert isinstance(info["format_ok"], bool) and set(info["reward_components"]) == {"format", "correct"}
        assert info["answer"] is None or len(info["answer"]) <= 64
        assert info["exact"] == (info["correctness"] == 1.0) and (info["answer"] is not None or not info["format_ok"])
        assert info["format_ok"] or reward == 0.0  # no credit outside the format


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_score_of_any_text_is_a_reward(text):
    reward, info = _score("house", text)
    assert 0.0 <= reward <= 1.0 and (info["format_ok"] or reward == 0.0)


WORD_JUNK = [*adversarial("message_decoding"), *(tagged("house") for tagged in TAGGED), "The word is house.",
             "house house", "answer: house", "house!", "house..", "h-o-u-s-e", "HOUSE\nHOUSE",
             "house" + "x" * 60, "Ηouse",  # a Greek capital eta
             "<answer>h o u s e</answer>", "h o u s e h o u s e h o u s e", "The letters: h=o u=s e=x.", "h=o=u=s",
             "{\"h\": \"o\"}", "a=h b=o <think>c=u</think>",
             # the right answers negated, hedged or beside a wrong one
             *wordings("house", "mouse"), *wordings("true", "false"), *wordings("h o u s e", "m o u s e")]


@pytest.mark.parametrize("letters", ["word", "spaced", "pairs"])
def test_answers_not_in_the_format_score_zero(letters):
    """Letters in tags, prose, JSON, spam or other scripts earn neither share, even where the last word is the truth
    (the last run of letters of `<answer></answer>` is "answer", one sample's truth here)."""
    samples = [_sample(word) for word in ("the", "house", "answer", "think", "true", "bbox", "something")]
    env = MessageDecodingEnv(samples=samples, params=MessageDecodingParams(letters=letters))
    states = [env.reset(i)[0] for i in range(len(samples))]
    for text in WORD_JUNK:
        for state in states:
            reward, info = env.score(state, text)
            assert reward == 0.0 and info["correctness"] == 0.0, (state.truth, text[:80])
            assert info["reward_components"] == {"format": 0.0, "correct": 0.0} and not info["format_ok"]
            assert info["answer"] is None and not info["exact"]


# --- metrics --------------------------------------------------------------------------


def _record(word, predicted):
    return {"id": "x", "pred_answer": predicted, "truth": {"coded": md_data.encode(word, DECODER), "decoder": DECODER,
                                                           "answer": word}}


def test_metrics_by_word_length():
    records = [_record("end", "end"), _record("bruce", "brute"), _record("neither", None),
               _record("stopped", "stopped"), _record("something", "somethin")]
    stats = MessageDecodingEnv.task_statistics(records)
    points = {name: stat.point() for name, stat in stats.items()}
    # char: 1, 4/5 (c vs t), 0 (nothing read), 1, 8/9 (one letter missing at the end)
    assert points == pytest.approx({"accuracy": 2 / 5, "char_accuracy": (1 + 4 / 5 + 0 + 1 + 8 / 9) / 5,
                                    "accuracy_3to4": 1.0, "accuracy_5to6": 0.0, "accuracy_7to8": 1 / 2,
                                    "accuracy_9to10": 0.0})
    assert all(isinstance(s, Statistic) for s in stats.values())
    assert stats["accuracy_7to8"].kind == "ratio" and list(stats["accuracy_7to8"].denominator) == [0, 0, 1, 1, 0]
    assert set(stats) <= set(MessageDecodingEnv.metric_rows)  # each has a table row; absent groups left out
    assert MessageDecodingEnv.usable_prediction(records[0]) and not MessageDecodingEnv.usable_prediction(records[2])
    assert [length_group(n) for n in (1, 2, 3, 4, 5, 9, 10, 14)] == [
        "accuracy_1to2", "accuracy_1to2", "accuracy_3to4", "accuracy_3to4", "accuracy_5to6", "accuracy_9to10",
        "accuracy_9to10", "accuracy_13to14"]
    with pytest.raises(ValueError, match="record 0 .*truth.answer"):
        MessageDecodingEnv.task_statistics([{"id": "x", "pred_answer": "a", "truth": {"answer": "Bad!"}}])


def test_record_fields_and_gallery_text():
    _, info = _score("house", "mouse")
    fields = MessageDecodingEnv.record_fields(info, _sample("house").meta)
    assert fields["pred_answer"] == "mouse" and fields["parsed"] == {"word": "mouse", "n_words": 1,
                                                                     "correctness": 0.8}
    assert fields["truth"] == {"coded": "piglc", "decoder": DECODER, "answer": "house"}
    assert MessageDecodingEnv.truth_text(fields["truth"]) == "piglc -> house"
    assert MessageDecodingEnv.outcome_text(fields) == "partial 0.80"
    assert MessageDecodingEnv.outcome_text({**fields, "pred_answer": "house"}) == "correct"


# --- tokenizer corpus ------------------------------------------------------------------


def test_default_tokenizer_corpus_is_unchanged_by_message_decoding():
    expected = [*envs.env_class("geospot").corpus(), *envs.env_class("nlvr2").corpus()]
    assert registry.TOKENIZER_ENVS == ("geospot", "nlvr2") and "message_decoding" in registry.BUILTIN
    assert envs.corpus() == expected and envs.corpus("geospot") == expected
    texts = MessageDecodingEnv.corpus()
    assert envs.corpus("message_decoding") == expected + texts
    assert len(texts) <= 26 + 2000 + 3 * 200 and texts == MessageDecodingEnv.corpus()
    assert set(string.ascii_lowercase) <= set(texts) and {"the", "house"} <= set(texts)
    test_words = set(md_data.pool("test", DEFAULTS)) | set(md_data.pool("test_ood", DEFAULTS))
    assert not test_words & set(texts)  # the tokenizer never learns a test answer as a word, plain or spelled
    assert not {spell(word) for word in test_words} & set(texts) and "h o u s e" in texts
    prompts = [t for t in texts if t.startswith("The image is a decoder table")]
    assert len(prompts) == 2 * 200 and not set(prompts) & set(expected)


# --- through the pipeline's libraries ----------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return build_shards(tmp_path_factory.mktemp("pipeline"), SMALL, "message_decoding")


def test_perception_labels_are_the_table_the_image_draws(shards):
    """One head per coded letter a-z, its class the plain letter drawn under it: decoding the message with the
    labels alone gives the answer, whatever order the cells stand in (test_ood may shuffle them)."""
    params, shards_dir, _ = shards
    for split in ("test", "test_ood"):
        env = envs.make("message_decoding", shards_dir=str(shards_dir), split=split)
        assert env.perception_heads == (27,) * 26
        for idx in range(len(env)):
            meta = env.reset(idx)[0].meta
            labels = env.perception_labels(meta)
            assert len(labels) == 26 and sorted(labels) == list(range(1, 27))
            assert "".join(chr(ord("a") + labels[ord(c) - ord("a")] - 1) for c in meta["coded"]) == meta["answer"]


def test_token_labels_name_the_cell_under_each_token():
    """At a 3 x 9 token grid every token sits on one cell and carries its (coded, plain) pair; the 27th place and the
    margin are blank (0), and a coarser grid samples the cells under its tokens' centres."""
    env = MessageDecodingEnv.__new__(MessageDecodingEnv)
    decoder = md_data.ALPHABET[::-1]
    labels = env.perception_token_labels({"decoder": decoder}, 3, 9)
    assert labels[:26] == [[i + 1, 26 - i] for i in range(26)] and labels[26] == [0, 0]
    coarse = env.perception_token_labels({"decoder": decoder}, 3, 4)
    assert coarse[:3] == [[1, 26], [4, 23], [6, 21]] and coarse[-1] == [0, 0]
    heads = env.perception_token_heads
    assert all(0 <= v < n for row in labels + coarse for v, n in zip(row, heads))


def test_env_serves_the_generated_samples_from_shards(shards):
    params, shards_dir, manifest = shards
    assert manifest["splits"]["test"]["kept"] == 6 and manifest["splits"]["test_ood"]["kept"] == 4
    env = envs.make("message_decoding", shards_dir=str(shards_dir), split="test")
    expected = md_data.generate_split(params.seed, "test", 6)
    assert len(env) == len(expected)
    for idx, sample in enumerate(expected):
        state, obs = env.reset(idx)
        assert state.meta["id"] == sample.id and state.meta["answer"] == sample.word
        # the default form: coded=plain pairs, the coded word spaced
        assert obs["messages"][0]["content"][-1]["text"] == PAIRS_PROMPT.format(coded=spell(sample.coded))
        assert len(obs["images"]) == 1 and obs["images"][0].size == (params.image_width, params.image_height)
        assert env.step_text(state, env.ideal_answer(state.meta))[2] == 1.0
        assert env.step_text(state, "no idea 42")[2] < 1.0 and env.step_text(state, "42")[2] == 0.0


def test_bad_raw_rows_are_counted_skips(tmp_path):
    from vlmgym.data.shard_writer import shard_raw
    from vlmgym.params import ShardParams

    params = replace(SMALL, raw_dir=str(tmp_path / "raw"), ood_images=0)
    MessageDecodingEnv.write_synthetic(params, tmp_path / "raw")
    path = layout.csv_path(tmp_path / "raw", "test")
    rows = [list(fields) for _, _, fields in layout.iter_csv(path)]
    rows[0][3] = "wrong"        # answer does not decode
    rows[1][2] = "abc"          # decoder not a permutation
    layout.write_csv(path, md_data.CSV_COLUMNS, rows)
    manifest = shard_raw(tmp_path / "raw", tmp_path / "shards", MessageDecodingEnv.schema, ShardParams(val_samples=0))
    test = manifest["splits"]["test"]
    assert test["kept"] == 4 and test["skipped"] == {"bad_answer": 1, "bad_decoder": 1}


def test_registered_under_its_name():
    assert envs.env_class("message_decoding") is MessageDecodingEnv and MessageDecodingEnv.name == "message_decoding"
    assert MessageDecodingEnv.ood_note and "message_decoding" in envs.names()
