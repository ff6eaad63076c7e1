"""Answers no built-in env may pay for: every env's fuzz test scores these and expects reward 0.

FORMATS holds one well-formed answer of each env; an env's test adds the others' (adversarial(name)), since a
right answer to one task is junk to another. JUNK is shared: tags, digit and word spam, JSON with non-finite or
missing numbers, empty and whitespace-only text, very long text, non-ASCII digits and letters, names of nothing
(emoji or punctuation only), negations, both answer words and hedges. wordings(answer, other) turns an env's right
answer into the same negated, two-answer (negated()) and hedged (hedged()) forms."""

from __future__ import annotations

FORMATS = {
    "geospot": "Country: France\nRegion: Île-de-France\nCity: Paris\nLatitude: 48.8566\nLongitude: 2.3522",
    "rec": '[{"bbox_2d": [100, 100, 300, 300], "label": "small red circle"}]',
    "nlvr2": "left: blue, red. right: green. red object: left yes, right no. True",
    "digits": "1, 3, 7",
    "message_decoding": "house",
    "ovd": '[{"bbox_2d": [100, 100, 300, 300], "label": "red circle"}, {"bbox_2d": [500, 500, 700, 700], '
           '"label": "blue square"}]',
    # user_data has no answer form of its own (its answers take the user's data's forms: words, numbers, letters,
    # boxes), so it adds none here; its tests (test_user_data.py, test_think.py) score all of adversarial("user_data")
}
# Answers another env rightly reads as one of its own, so they are no junk to it: rec scores the first box of any
# answer (tests/envs/test_rec_boxes.py), and an ovd answer is a list of boxes. (An env's own answer is left out
# anyway.) ovd's tests still score rec's answer: its label, "small red circle", names no ovd category.
READS = {"rec": ("ovd",)}

# Names of nothing: text that normalises to no letter or digit, alone and as geospot's name lines
NAMELESS = ["💩", "!!!", "-", "—", "…", "🙂🙂🙂", "?!", "*", "City: 💩", "City: !!!", "City: -", "City: —",
            "Region: 🙂\nCity: ?!", "Country: 💩\nRegion: !!!\nCity: —", "💩, !!!, —", "Country: ...\nCity: ~~"]
# Answers that do not say one thing: negations, both words, hedges (every env's right answer gets these too:
# wordings())
NEGATIONS = ["not true", "The statement is not true", "isn't true", "It isn't true.", "not false",
             "The statement is not false.", "No, not true", "never true"]
BOTH_WORDS = ["True or False", "true and false", "True/False", "yes and no", "True, False", "either true or false"]
HEDGES = ["probably true", "maybe false", "I think true", "Perhaps True.", "likely false", "I guess yes",
          "possibly no", "true?"]
WORDING = [*NAMELESS, *NEGATIONS, *BOTH_WORDS, *HEDGES]

JUNK = [
    # empty and whitespace
    "", " ", "\n\t \n", ".", "\x00", "\ud800",
    # tags, empty or around junk
    "<answer></answer>", "<think>..</think>", "<think></think><answer></answer>", "<think>" * 50,
    "<answer>" * 20 + "</answer>" * 20, "<think>\n</think>\n<answer>\n</answer>",
    # digit spam
    "0123456789" * 200, "7 " * 500, "1, 2, 3, 4, 5, 6, 7, 8, 9, 0", "9" * 5000, "-" + "1" * 30, "1" * 3,
    ",".join("7" * 50),
    # word spam
    "house " * 500, "a" * 1000, "abcdefghijklmnopqrstuvwxyz", "true false yes no " * 50, "true " * 300,
    "lorem ipsum dolor sit amet " * 4000,
    # JSON with non-finite, missing or no numbers
    '[{"bbox_2d": [1e309, -5, "x", null]}]', '{"bbox_2d": []}', '[{"bbox_2d": [-1e309, -1e309, 1e309, 1e309]}]',
    "[1e309, 1e309, -1e309, -1e309]", "[NaN, Infinity, -Infinity, null]", '{"answer": 1e309}', "-inf", "[]", "{}",
    # very long
    "x" * 100_000, "\n" * 50_000,
    # digits and letters of other scripts
    "١, ٣, ٧", "١١", "१, ३, ७", "１, ３, ７", "１１", "①②③", "٣", "hôuse", "ΗΟΥΣΕ", "ℌ𝔬𝔲𝔰𝔢",
    # names of nothing, negations, both words, hedges
    *WORDING,
]


# JSON's constants bare: junk to every env but message_decoding, where each is a (wrong) word of letters
CONSTANTS = ["null", "NaN", "inf", "Infinity"]
# an answer inside tags: no env asks for tags without its think option, and with it the answer block is unwrapped
# before the env sees the answer
TAGGED = ("<think>{}</think>".format, "<answer><answer>{}</answer>".format,
          "<think>{}</think><answer></answer>".format, "<answer>{}</answer>".format)


def negated(answer: str, other: str) -> list[str]:
    """`answer` (right) negated, or beside `other` (a wrong answer): neither says the answer."""
    return [f"not {answer}", f"It is not {answer}.", f"not: {answer}", f"{answer} or {other}",
            f"{other} or {answer}", f"{answer} and {other}", f"{answer}/{other}", f"either {answer} or {other}"]


def hedged(answer: str) -> list[str]:
    """`answer` (right) with a hedge: not the answer's form."""
    return [f"probably {answer}", f"maybe {answer}", f"I think {answer}", f"perhaps: {answer}", f"{answer}?"]


def wordings(answer: str, other: str) -> list[str]:
    """negated() and hedged(): the right answer in forms that do not say it alone."""
    return [*negated(answer, other), *hedged(answer)]


def adversarial(name: str) -> list[str]:
    """JUNK, the other envs' answers (but those `name` READS), and those answers inside tags."""
    others = [text for env, text in FORMATS.items() if env != name and env not in READS.get(name, ())]
    constants = [] if name == "message_decoding" else CONSTANTS
    return [*JUNK, *constants, *others, *(tagged(text) for text in others for tagged in TAGGED)]
