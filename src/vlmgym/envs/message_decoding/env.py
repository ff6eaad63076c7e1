"""message_decoding: decode a coded English word with the letter table in the image.

The message decoding task of r1_vlm: the image is a decoder table (each coded letter over the plain letter it stands
for, a fresh permutation of a-z per sample) and the prompt gives a common English word in that code; the answer is
the plain word. Data: data.py (words, code, splits) and render.py (the table); synthetic source only, there is no
hub loader, so `data.source: hub` stops with the base class's MissingPart error.

Reward, in [0, 1] for any text: format_weight x format_ok + (1 - format_weight) x correctness (format_weight:
`env.message_decoding.format_weight`, 0.1 by default).
- format_ok: the whole answer is one word of 1 to MAX_ANSWER letters A-Z / a-z (either case; no answer is
  longer), give or take surrounding whitespace, a quote on either side and one final full stop; several words,
  digits, tags or other scripts are not.
- The word read: that word, lowercased; an answer not in that format reads no word (None) and scores 0, so
  "The word is house." and "<answer>house</answer>" earn nothing.
- correctness: position-wise matching letters / max(len(word read), len(truth)): 1 exactly for the right word,
  and a missing, extra or misplaced letter each costs a share, so padding with guesses does not pay.
A wrong word in the format earns the format share and the letters that happen to sit in place; anything else 0.
`env.message_decoding.letters` sets how the coded word and the answer are written: `word` (the above), `spaced`
(letter by letter, one space between letters, r1_vlm's `K X I X R S`: the coded word "p i g l c", the answer
"h o u s e") or `pairs` (the default; the coded word spaced, the answer each coded letter with its plain one: "p=h
i=o g=u l=s c=e", the word read being the plain letters). The answer's form is the format: another form reads no word.
`n_words` in the info counts the runs of letters of any script in the text (read_word), for diagnosis.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vlmgym.config.spec import spec
from vlmgym.data import layout
from vlmgym.data.rows import SAFE_KEY, Row, RowSchema, RowSkip
from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.message_decoding import data as md_data
from vlmgym.envs.message_decoding.render import place_at, render_table
from vlmgym.envs.think import ThinkParams
from vlmgym.stats.bootstrap import Statistic
from vlmgym.stats.fields import record_field, record_where

PROMPT = ('The image is a decoder table: each coded letter above maps to the plain letter below. Decode the message '
          '"{coded}". Answer with the decoded word.')
# shorter than PROMPT: a spelled-out 10-letter word (test_ood's longest) still fits the 64-token prompt bucket
SPACED_PROMPT = ('The image is a decoder table (coded letter above, plain below). Decode "{coded}", letters spaced '
                 'alike.')
PAIRS_PROMPT = 'The image is a decoder table (coded letter above, plain below). Decode "{coded}" as coded=plain pairs.'
MAX_WORD_LETTERS = 64  # answers have at most 14; a longer run is not read (nor well-formed), so records stay small
LETTERS = re.compile(r"[^\W\d_]+")  # a run of letters of any script
MAX_ANSWER = md_data.MAX_LENGTH + md_data.OOD_EXTRA_LETTERS
FORMAT = re.compile(rf"\s*[\"'“”‘’`]?([A-Za-z]{{1,{MAX_ANSWER}}})[\"'“”‘’`]?\.?\s*", re.ASCII)
FORMATS = {"word": FORMAT,  # the word read: group 1, less its spaces and coded letters
           "spaced": re.compile(rf"\s*[\"'“”‘’`]?([A-Za-z](?: [A-Za-z]){{0,{MAX_ANSWER - 1}}})[\"'“”‘’`]?\.?\s*",
                                re.ASCII),
           "pairs": re.compile(rf"\s*([A-Za-z]=[A-Za-z](?: [A-Za-z]=[A-Za-z]){{0,{MAX_ANSWER - 1}}})\.?\s*", re.ASCII)}
LETTER_FORMS = tuple(FORMATS)
ANSWER = re.compile(rf"[a-z]{{1,{MAX_ANSWER}}}")
# exact accuracy by word length, two lengths a group: 3-4, 5-6, 7-8 (train and test), 9-10 (test_ood's long words)
LENGTH_GROUPS = tuple((low, low + 1) for low in range(1, MAX_ANSWER + 1, 2))
CORPUS_WORDS = 2000  # train words in the tokenizer corpus, most frequent first
CORPUS_PROMPTS = 200  # prompts with a coded word in the corpus


@dataclass(frozen=True)
class MessageDecodingParams(ThinkParams):
    """message_decoding reward: per-letter correctness plus a share for answering with one bare word."""

    format_weight: float = spec(0.1, ge=0, le=1, doc="share of the reward for an answer of the expected shape "
                                                     "(one word of letters)")
    letters: str = spec("pairs", choices=LETTER_FORMS,
                        doc="how the coded word and the answer are written: word ('piglc' -> 'house'), spaced "
                            "('p i g l c' -> 'h o u s e', r1_vlm's; each letter its own token) or pairs ('p i g l "
                            "c' -> 'p=h i=o g=u l=s c=e', each coded letter then its plain one); the answer must "
                            "take that form")


def read_word(text: Any) -> tuple[str | None, int]:
    """(the last run of letters in `text`, lowercased, or None when there is none or it is implausibly long; how
    many runs there are)."""
    last, count = None, 0
    for match in LETTERS.finditer(text if isinstance(text, str) else ""):
        last, count = match, count + 1
    if last is None:
        return None, 0
    word = last.group().lower()
    return (word if len(word) <= MAX_WORD_LETTERS else None), count


def char_credit(predicted: str | None, truth: str) -> float:
    """Position-wise matching letters / max(len(predicted), len(truth)): 1 exactly when they are equal."""
    if not predicted or not truth:
        return 0.0
    return sum(p == t for p, t in zip(predicted, truth)) / max(len(predicted), len(truth))


def spell(word: str) -> str:
    """`word` letter by letter, one space between letters: the spaced prompt's and answer's form."""
    return " ".join(word)


def answer_text(letters: str, coded: str, word: str) -> str:
    """`word`, the decoded `coded`, written in the `letters` form (pairs: 'p=h i=o g=u', each coded letter with its
    plain one)."""
    if letters == "pairs":
        return " ".join(f"{c}={p}" for c, p in zip(coded, word))
    return spell(word) if letters == "spaced" else word


def read_answer(letters: str, match: re.Match) -> str:
    """The word an answer in the `letters` form spells (the plain letters of pairs), lowercased."""
    text = match.group(1).lower()
    return text[2::4] if letters == "pairs" else text.replace(" ", "")


def length_group(length: int) -> str:
    """The metric of exact accuracy for words of `length` letters, e.g. accuracy_5to6."""
    low = length - (length + 1) % 2
    return f"accuracy_{low}to{low + 1}"


def parse_row(rec: dict[str, str]) -> Row:
    """One raw row (id, coded, decoder, answer, image, optional drawn) as a sample; anything inconsistent is a
    counted skip."""
    sample_id = rec["id"].strip()
    if not SAFE_KEY.match(sample_id):
        raise RowSkip("bad_id", f"id {rec['id']!r} is not a plain token (letters, digits, _ and -)")
    decoder = rec["decoder"].strip()
    if not md_data.is_permutation(decoder):
        raise RowSkip("bad_decoder", f"decoder {rec['decoder']!r} is not a permutation of a-z")
    coded = rec["coded"].strip()
    if not ANSWER.fullmatch(coded):
        raise RowSkip("bad_coded", f"coded {rec['coded']!r} is not 1-{MAX_ANSWER} letters a-z")
    answer = md_data.decode(coded, decoder)
    if rec["answer"].strip() != answer:
        raise RowSkip("bad_answer", f"answer {rec['answer']!r} is not {coded!r} decoded ({answer!r})")
    meta = {"id": sample_id, "coded": coded, "decoder": decoder, "answer": answer}
    drawn = (rec.get("drawn") or "").strip()
    if drawn:
        if not (md_data.WORD.fullmatch(drawn) and drawn == "".join(sorted(set(drawn))) and set(coded) <= set(drawn)):
            raise RowSkip("bad_drawn", f"drawn {rec['drawn']!r} is not sorted distinct letters a-z holding every "
                                       f"letter of coded {coded!r}")
        meta["drawn"] = drawn
    return Row(sample_id, (rec["image"].strip(),), meta)


class MessageDecodingEnv(Env):
    """Decode a coded word with the table in one image; samples come from webdataset shards.

    Data: the embedded generator only (data.py); `data.source: hub` raises the base class's MissingPart."""

    name = "message_decoding"
    Params = MessageDecodingParams
    DataParams = md_data.MessageDecodingDataParams
    schema = RowSchema("message_decoding", md_data.REQUIRED_COLUMNS, ("jpg",), parse_row)
    solved_metric = "accuracy"
    # docs/envs/message_decoding.md, chosen on the val split: 288x96 images at 27,648 pixels make the 3 x 9 table one
    # image token a cell; the warm-up's token labels teach each token its cell's letters on whole tables
    # (perception_view), SFT on word tables, whose plain letters are the answer's, starts the lookup; the letters in
    # coded=plain pairs put each plain letter right after the coded one it is looked up by. GRPO keeps the defaults:
    # neither they nor lr 3e-5 at temperature 0.6 moved val over three seeds (SFT fits the train samples).
    recipe = {"data": {"train_images": 4000, "image_width": 288, "image_height": 96,
                       "message_decoding": {"table": "word"}},
              "model": {"max_pixels": 27648},
              "sft": {"steps": 3000, "freeze": "vision", "optimizer": {"lr": 0.001},
                      "perception": {"steps": 2000, "optimizer": {"lr": 0.001}}}}
    metric_rows = {"accuracy": ("accuracy", "rate"), "char_accuracy": ("character accuracy", "rate"),
                   **{length_group(low): (f"accuracy, {low}-{high} letters", "rate") for low, high in LENGTH_GROUPS}}
    ood_note = (f"words longer than train ever uses (max_length + 1 to + {md_data.OOD_EXTRA_LETTERS} letters, 9-10 by "
                "default; data.message_decoding.ood_shift: long, or shuffled, the table's cells out of alphabetical "
                "order), from the test word pool")

    def check_sample(self, sample: SampleLike) -> None:
        coded, decoder, answer = (sample.meta.get(k) for k in ("coded", "decoder", "answer"))
        if not (isinstance(decoder, str) and md_data.is_permutation(decoder) and isinstance(coded, str)
                and ANSWER.fullmatch(coded) and answer == md_data.decode(coded, decoder)):
            raise ValueError(f"message_decoding: sample {sample.key} has coded {coded!r}, decoder {decoder!r} and "
                             f"answer {answer!r}, expected a-z letters, a permutation of a-z and the decoded word")

    @classmethod
    def describe_ood(cls, settings: Any) -> str:
        """The configured shift (data.message_decoding.ood_shift: long or shuffled)."""
        if settings.ood_shift == "shuffled":
            return ("the decoder table's cells out of alphabetical order (data.message_decoding.ood_shift: shuffled), "
                    "on test-pool words of train's lengths")
        low, high = settings.max_length + 1, settings.max_length + md_data.OOD_EXTRA_LETTERS
        return (f"words of {low}-{high} letters, longer than train ever uses (data.message_decoding.ood_shift: "
                "long), from the test word pool")

    def prompt(self, sample: SampleLike) -> str:
        """The question, with the coded word."""
        coded, letters = sample.meta["coded"], self.params.letters
        if letters == "word":
            return PROMPT.format(coded=coded)
        return (SPACED_PROMPT if letters == "spaced" else PAIRS_PROMPT).format(coded=spell(coded))

    def prepare_truth(self, sample: SampleLike) -> str:
        """The plain word."""
        return sample.meta["answer"]

    def score(self, state: State, text: str) -> tuple[float, dict]:
        """format_weight x format_ok + (1 - format_weight) x correctness (module docstring); never raises."""
        text = text if isinstance(text, str) else ""
        truth = state.truth if state.truth is not None else state.meta["answer"]
        _, n_words = read_word(text)
        # only a bare word is read: the last word of any text would pay for prose, tags and JSON keys
        match = FORMATS[self.params.letters].fullmatch(text)
        format_ok = match is not None
        word = read_answer(self.params.letters, match) if match else None
        correctness = char_credit(word, truth)
        weight = self.params.format_weight
        components = {"format": weight * format_ok, "correct": (1 - weight) * correctness}
        reward = min(1.0, max(0.0, components["format"] + components["correct"]))
        info = {
            "answer": word,
            "n_words": n_words,
            "correctness": correctness,
            "exact": word is not None and word == truth,
            "format_ok": format_ok,
            "parse_failed": word is None,
            "reward_components": components,
        }
        return reward, info

    def ideal_answer(self, meta: dict[str, Any]) -> str:
        """The SFT target: the plain word, in the `letters` form."""
        return answer_text(self.params.letters, meta["coded"], meta["answer"])

    # the plain letter under each of the 26 coded letters a-z (0: its cell is empty, 1-26: a-z): the table the image
    # draws, wherever the cells stand (alphabetical, or shuffled out of distribution)
    perception_heads = (27,) * 26

    def perception_labels(self, meta: dict[str, Any]) -> list[int]:
        """The table: for coded letter a+i, 0 when its cell is empty, else 1 + its plain letter decoder[i] (0-25)."""
        drawn = meta.get("drawn") or md_data.ALPHABET
        return [1 + ord(plain) - ord("a") if coded in drawn else 0 for coded, plain in zip(md_data.ALPHABET,
                                                                                           meta["decoder"])]

    # for each merged image token, the coded and the plain letter of the cell under its centre (0: none, 1-26: a-z),
    # so a token carries its own cell's pair and the language model can find a coded letter's plain one by content
    perception_token_heads = (27, 27)

    def perception_token_labels(self, meta: dict[str, Any], rows: int, cols: int) -> list[list[int]]:
        """(coded, plain) per token, row by row; the cells stand in alphabetical order, as train and test draw them
        (test_ood's shuffled tables are never warmed up on)."""
        labels, drawn = [], meta.get("drawn") or md_data.ALPHABET
        for row in range(rows):
            for col in range(cols):
                place = place_at((col + 0.5) / cols, (row + 0.5) / rows)
                if place is None or place >= len(md_data.ALPHABET) or md_data.ALPHABET[place] not in drawn:
                    labels.append([0, 0])
                else:
                    labels.append([place + 1, ord(meta["decoder"][place]) - ord("a") + 1])
        return labels

    def perception_view(self, image: Image.Image, meta: dict[str, Any]) -> tuple[Image.Image, dict[str, Any]]:
        """A word table's sample as its whole table, drawn again from the sample's code as the generator draws it
        (alphabetical cells, the same size, through the generator's JPEG): a word table shows 3-8 letters, too few
        for the warm-up to learn to read them (docs/envs/message_decoding.md), so the tower learns on whole tables
        and SFT then answers on the word tables."""
        if not meta.get("drawn"):
            return image, meta
        whole = render_table(meta["decoder"], md_data.ALPHABET, *image.size)
        return Image.open(io.BytesIO(layout.encode_jpeg(whole))).convert("RGB"), {**meta, "drawn": ""}

    @classmethod
    def corpus(cls) -> list[str]:
        """The alphabet, the most frequent default train words and prompts with coded words, plain and spelled out
        (tokenizer training; the pairs form tokenizes as the spaced one does); never a test word."""
        words = md_data.pool("train", md_data.MessageDecodingDataParams())[:CORPUS_WORDS]
        decoder = md_data.ALPHABET[::-1]  # any fixed code: the prompts' coded words are letter soup either way
        coded = [md_data.encode(w, decoder) for w in words[:CORPUS_PROMPTS]]
        return [*md_data.ALPHABET, *words, *(PROMPT.format(coded=c) for c in coded),
                *(spell(w) for w in words[:CORPUS_PROMPTS]), *(SPACED_PROMPT.format(coded=spell(c)) for c in coded)]

    @classmethod
    def write_synthetic(cls, data: Any, out_dir: Path) -> dict:
        """Coded common words with their tables; `data.train_images` / `test_images` / `ood_images` count samples."""
        return md_data.write_synthetic_raw(data, out_dir, cls.data_settings(data))

    @classmethod
    def record_fields(cls, info: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
        """What the parser read (the word, how many words, the letter credit) and the truth (coded word, table,
        answer)."""
        return {"parsed": {"word": info.get("answer"), "n_words": info.get("n_words"),
                           "correctness": info.get("correctness")},
                "pred_answer": info.get("answer"),
                "truth": {"coded": meta.get("coded"), "decoder": meta.get("decoder"), "answer": meta.get("answer")}}

    @classmethod
    def usable_prediction(cls, record: Mapping[str, Any]) -> bool:
        """An answer that is one word (the format)."""
        return isinstance(record.get("pred_answer"), str)

    @classmethod
    def task_statistics(cls, records: Sequence[Mapping[str, Any]], **options: Any) -> dict[str, Statistic]:
        """Exact-match accuracy, mean letter credit (char_accuracy), and exact accuracy per word-length group as
        ratios over all records (another group's record adds 0 / 0), so the shared bootstrap resamples whole test
        sets and differences stay paired; groups absent from `records` are left out."""
        correct, credit, groups = [], [], []
        for i, record in enumerate(records):
            where = record_where(record, i)
            truth = record_field(record, "truth", where)
            answer = truth.get("answer") if isinstance(truth, Mapping) else None
            if not isinstance(answer, str) or not ANSWER.fullmatch(answer):
                raise ValueError(f"{where}: truth.answer must be 1-{MAX_ANSWER} letters a-z, got {answer!r}")
            predicted = record.get("pred_answer")
            predicted = predicted if isinstance(predicted, str) else None
            correct.append(predicted == answer)
            credit.append(char_credit(predicted, answer))
            groups.append(length_group(len(answer)))
        correct = np.asarray(correct, np.float64)
        stats = {"accuracy": Statistic("mean", correct), "char_accuracy": Statistic("mean", np.asarray(credit))}
        for low, _ in LENGTH_GROUPS:
            metric = length_group(low)
            member = np.array([g == metric for g in groups], np.float64)
            if member.any():
                stats[metric] = Statistic("ratio", member * correct, member)
        return stats

    @classmethod
    def truth_text(cls, truth: Mapping[str, Any]) -> str:
        """The coded word and its answer."""
        return f"{truth.get('coded')} -> {truth.get('answer')}"

    @classmethod
    def outcome_text(cls, record: Mapping[str, Any]) -> str:
        """correct, partial (some letters in place) or wrong."""
        if record.get("pred_answer") is not None and record.get("pred_answer") == record["truth"].get("answer"):
            return "correct"
        credit = (record.get("parsed") or {}).get("correctness")
        return f"partial {credit:.2f}" if isinstance(credit, float) and 0 < credit < 1 else "wrong"
