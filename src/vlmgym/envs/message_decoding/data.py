"""message_decoding data: common English words under a per-sample substitution code, with the decoder table drawn.

Writes the message_decoding raw layout that the shard stage reads:

    {raw}/{split}.csv             columns id,coded,decoder,answer,image,drawn
    {raw}/images/{split}/NN.zip   the jpgs named in the image column

Words: the `data.message_decoding.words` (5,000) most frequent English words of wordfreq's bundled list (no
network), kept when they are lowercase a-z only, of `min_length`..`max_length` letters (3-8). They are split once,
by a hash of the word alone (about 80/20, never the seed), into a train pool and a test pool: train draws only
train-pool words and test / test_ood only test-pool ones, so a test answer is never a word train showed.

Code: each sample draws a random permutation of a-z; `decoder` is its 26 plain letters, the i-th being the plain
letter of coded letter a+i, and the coded word replaces each plain letter by the coded letter that decodes to it.
A letter may code as itself (a uniform permutation, not a derangement). The image (render.py) draws the table, coded
letters in alphabetical order: all 26 cells (`data.message_decoding.table: full`, the default), or only the cells of
the coded word's letters, the others left empty (`table: word`; `drawn` lists them; empty: the whole table). With
the whole table every image holds the same 26 plain letters, so a model that attends to the image evenly learns
nothing from it; with the word's cells alone the image shows which letters the answer uses, a first step a small
model can take before it learns which cell each letter comes from.

test_ood (`data.ood_images` > 0) shifts what train never shows (`data.message_decoding.ood_shift`):
- long (the default): test-pool words of max_length + 1 to max_length + OOD_EXTRA_LETTERS letters (9-10 by default),
  longer than any train answer, with the same table;
- shuffled: test-pool words of train's lengths, but the table's cells in a random order rather than alphabetical,
  so a coded letter must be searched for rather than found by its place.

Everything is deterministic per (seed, split, index): a rerun writes byte-identical files.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlmgym.config.sections import DataParams
from vlmgym.config.spec import ParamsError, spec
from vlmgym.data import layout
from vlmgym.envs.message_decoding.render import render_table

ALPHABET = string.ascii_lowercase
CSV_COLUMNS = ("id", "coded", "decoder", "answer", "image", "drawn")
REQUIRED_COLUMNS = CSV_COLUMNS[:-1]  # drawn is optional: raw data written before it draws the whole table
IMAGES_PER_ZIP = 10_000
TEST_POOL_PERCENT = 20
OOD_SHIFTS = ("long", "shuffled")
TABLES = ("full", "word")
OOD_EXTRA_LETTERS = 2  # test_ood's long words: up to this many letters beyond max_length
MAX_LENGTH = 12  # the longest max_length; with OOD_EXTRA_LETTERS it bounds every answer (and the metric rows)
WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class MessageDecodingDataParams:
    """message_decoding's generator: the word list, the word lengths and the shift of the test_ood split."""

    words: int = spec(5000, ge=100, le=50_000, doc="how many of wordfreq's most frequent English words to draw from "
                                                   "(those of letters a-z only and of the lengths below are kept)")
    min_length: int = spec(3, ge=1, le=MAX_LENGTH, doc="shortest word in letters")
    max_length: int = spec(8, ge=1, le=MAX_LENGTH, doc="longest word in letters (>= min_length) in train and test")
    ood_shift: str = spec("long", choices=OOD_SHIFTS,
                          doc=f"what test_ood shifts: long (words of max_length + 1 to + {OOD_EXTRA_LETTERS} "
                              "letters) or shuffled (the table's cells out of alphabetical order); train and test "
                              "show neither")
    table: str = spec("full", choices=TABLES,
                      doc="which cells of the table the image fills: full (all 26) or word (only the coded word's "
                          "letters, the rest empty: the image shows which letters the answer uses, an easier start "
                          "for a small model)")

    def __post_init__(self) -> None:
        if self.max_length < self.min_length:
            raise ParamsError(f"data.message_decoding: max_length {self.max_length} is below min_length "
                              f"{self.min_length}")


@functools.cache
def vocabulary(size: int) -> tuple[str, ...]:
    """wordfreq's `size` most frequent English words that are lowercase a-z only, most frequent first."""
    from wordfreq import top_n_list

    return tuple(dict.fromkeys(w for w in top_n_list("en", size) if WORD.fullmatch(w)))


def in_test_pool(word: str) -> bool:
    """Whether `word` belongs to the test pool: a hash of the word alone, so the pools never depend on the seed, the
    list's size or the lengths, and never overlap."""
    digest = hashlib.sha256(f"message_decoding-pool-{word}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < TEST_POOL_PERCENT


def lengths(split: str, settings: MessageDecodingDataParams) -> range:
    """The word lengths `split` draws: train's for train and test, longer ones for test_ood under the long shift."""
    if split == "test_ood" and settings.ood_shift == "long":
        return range(settings.max_length + 1, settings.max_length + OOD_EXTRA_LETTERS + 1)
    return range(settings.min_length, settings.max_length + 1)


@functools.cache
def pool(split: str, settings: MessageDecodingDataParams) -> tuple[str, ...]:
    """The words `split` draws from: its pool (train, or test for test and test_ood) at its lengths."""
    test = split != "train"
    allowed = lengths(split, settings)
    words = tuple(w for w in vocabulary(settings.words) if in_test_pool(w) == test and len(w) in allowed)
    if not words:
        raise ValueError(f"message_decoding: no {split} word of {allowed.start}-{allowed.stop - 1} letters among the "
                         f"{settings.words} most frequent; raise data.message_decoding.words or change the lengths")
    return words


def encode(word: str, decoder: str) -> str:
    """`word` in the code whose table is `decoder` (decoder[i]: the plain letter of coded letter a+i)."""
    coded_of = {plain: coded for coded, plain in zip(ALPHABET, decoder)}
    return "".join(coded_of[ch] for ch in word)


def decode(coded: str, decoder: str) -> str:
    """The plain word of `coded` under `decoder`."""
    return "".join(decoder[ALPHABET.index(ch)] for ch in coded)


def is_permutation(text: str) -> bool:
    """Whether `text` holds each of a-z exactly once."""
    return len(text) == len(ALPHABET) and set(text) == set(ALPHABET)


@dataclass(frozen=True)
class MessageSample:
    """One generated sample: the word, its code, and the order the table's cells are drawn in."""

    id: str
    word: str
    decoder: str
    columns: str  # the coded letters in drawing order
    drawn: str = ""  # the coded letters whose cells hold letters, sorted (empty: all 26)

    @property
    def coded(self) -> str:
        return encode(self.word, self.decoder)


def generate_sample(seed: int, split: str, index: int, settings: MessageDecodingDataParams) -> MessageSample:
    """One sample's description (nothing rendered): a word of the split's pool and a fresh permutation."""
    rng = random.Random(f"message_decoding-{seed}-{split}-{index}")
    words = pool(split, settings)
    word = words[rng.randrange(len(words))]
    decoder = "".join(rng.sample(ALPHABET, len(ALPHABET)))
    shuffled = split == "test_ood" and settings.ood_shift == "shuffled"
    columns = "".join(rng.sample(ALPHABET, len(ALPHABET))) if shuffled else ALPHABET
    drawn = "".join(sorted(set(encode(word, decoder)))) if settings.table == "word" else ""
    return MessageSample(f"{split}-{index:06d}", word, decoder, columns, drawn)


def generate_split(seed: int, split: str, count: int,
                   settings: MessageDecodingDataParams | None = None) -> list[MessageSample]:
    """`count` deterministic samples of `split`."""
    settings = settings or MessageDecodingDataParams()
    return [generate_sample(seed, split, i, settings) for i in range(count)]


def write_raw_split(out_dir: Path, split: str, samples: list[MessageSample], width: int, height: int) -> int:
    """{split}.csv and images/{split}/NN.zip for `samples`; returns the rows written."""
    items = (([s.id, s.coded, s.decoder, s.word, f"{s.id}.jpg", s.drawn],
              [(f"{s.id}.jpg", layout.encode_jpeg(render_table(s.decoder, s.columns, width, height, s.drawn)))])
             for s in samples)
    return layout.write_split(out_dir, split, CSV_COLUMNS, items, IMAGES_PER_ZIP)


def write_synthetic_raw(params: DataParams, out_dir: str | Path,
                        settings: MessageDecodingDataParams | None = None) -> dict[str, Any]:
    """Write train_images / test_images samples (and ood_images of test_ood) into the raw layout; returns counts."""
    settings = settings or MessageDecodingDataParams()
    out_dir = Path(out_dir)
    splits = [("train", params.train_images), ("test", params.test_images)]
    if params.ood_images:
        splits.append(("test_ood", params.ood_images))
    counts: dict[str, Any] = {}
    for split, count in splits:
        samples = generate_split(params.seed, split, count, settings)
        counts[f"{split}_words"] = len(pool(split, settings))
        counts[f"{split}_samples"] = write_raw_split(out_dir, split, samples, params.image_width, params.image_height)
        counts[f"{split}_distinct_words"] = len({s.word for s in samples})
    return counts
