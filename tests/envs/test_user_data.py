"""The user_data env: reading a VLM-R1 jsonl and a `datasets` folder (or parquet), splits, counted skips, the named
rewards on the same inputs, junk, and TRL-style reward functions (a good one, one that raises, one of the wrong
length)."""

from __future__ import annotations

import json
import random
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from adversarial import adversarial
from shard_helpers import build_shards
from user_data_files import BAD_REASONS, EXAMPLE_LINES, write_dataset, write_jsonl

from vlmgym import envs
from vlmgym.data.shards import Sample
from vlmgym.envs.user_data import data as user_data
from vlmgym.envs.user_data import rewards
from vlmgym.envs.user_data.functions import FAILED, RewardFunctionError
from vlmgym.envs.user_data.read import UserDataError
from vlmgym.params import DataParams, EnvParams, ParamsError, from_dict

DOC = Path(__file__).resolve().parents[2] / "docs" / "envs" / "user_data.md"
ENV = envs.env_class("user_data")


def files(**kwargs) -> user_data.UserDataFiles:
    return user_data.UserDataFiles(**kwargs)


def jsonl_files(path: Path, **kwargs) -> user_data.UserDataFiles:
    """The settings of a jsonl written by write_jsonl, whose images are in images/ beside it (as on the page)."""
    return files(path=str(path), image_root=str(path.parent / "images"), **kwargs)


# --- reading ----------------------------------------------------------------------------


def test_a_vlm_r1_jsonl_is_read_with_its_images_and_bad_lines_are_counted_where_they_are(tmp_path):
    path = write_jsonl(tmp_path, rows=40)
    splits, details = user_data.user_records(jsonl_files(path), seed=0)
    assert len(splits["train"]) + len(splits["test"]) == 40 and len(splits["test"]) == 4  # test_share 0.1
    info = details["all"]
    assert info["rows"] == 40 and info["skipped"] == BAD_REASONS
    assert info["examples"]["image_missing"][0].startswith("vqa.jsonl line 41: ")
    assert "absent.png" in info["examples"]["image_missing"][0]
    assert info["examples"]["bad_json"][0].startswith("vqa.jsonl line 44: ")
    records = {r.key: r for r in splits["train"] + splits["test"]}
    pair = records["pair-1"]
    assert len(pair.images) == 2 and pair.answer == "B" and "<image>" not in pair.question
    assert pair.question.startswith("Are both squares the same colour?")
    assert records["colour-1"].columns["solution"] == "red" and records["q000"].columns["source"] == "generated"


def test_the_seeded_split_depends_on_the_seed_and_the_ids_not_the_order(tmp_path):
    path = write_jsonl(tmp_path, rows=40, bad=False)
    test = {r.key for r in user_data.user_records(jsonl_files(path), seed=0)[0]["test"]}
    lines = path.read_text().splitlines()
    path.write_text("\n".join(reversed(lines)) + "\n")
    assert {r.key for r in user_data.user_records(jsonl_files(path), seed=0)[0]["test"]} == test
    assert {r.key for r in user_data.user_records(jsonl_files(path), seed=1)[0]["test"]} != test
    half = user_data.user_records(jsonl_files(path, test_share=0.5), seed=0)[0]
    assert len(half["test"]) == 20


def test_image_root_and_placeholders(tmp_path):
    write_jsonl(tmp_path, rows=6, bad=False)
    line = {"id": "x", "image": "red-0.png", "conversations": [{"from": "human", "value": "<image><image>Two?"},
                                                               {"from": "gpt", "value": "red"}]}
    ok = {"id": "y", "image": "red-0.png", "conversations": [{"from": "human", "value": "No placeholder: colour?"},
                                                             {"from": "gpt", "value": "red"}]}
    elsewhere = tmp_path / "lists" / "set.jsonl"
    elsewhere.parent.mkdir()
    elsewhere.write_text("".join(json.dumps(x) + "\n" for x in (line, ok, {**ok, "id": "z"}, ok)))
    splits, details = user_data.user_records(files(path=str(elsewhere), image_root=str(tmp_path / "images")), 0)
    assert details["all"]["skipped"] == {"image_count": 1} and details["all"]["rows"] == 3
    assert {r.key for r in splits["train"] + splits["test"]} == {"y", "z", "y-line4"}  # a repeated id is kept
    assert {r.question for r in splits["train"] + splits["test"]} == {"No placeholder: colour?"}
    # without image_root the paths are relative to the jsonl's folder, where there are no images
    with pytest.raises(UserDataError, match=r"no usable row .*image_missing"):
        user_data.user_records(files(path=str(elsewhere)), 0)


def test_a_saved_dataset_dict_gives_its_own_splits(tmp_path):
    path = write_dataset(tmp_path, rows=40)
    splits, details = user_data.user_records(files(path=str(path)), seed=0)
    assert details["train"]["skipped"] == {"missing_answer": 1} and details["test"]["skipped"] == {}
    assert details["train"]["examples"]["missing_answer"][0].startswith("vqa_dataset/train row ")
    assert len(splits["test"]) == len([i for i in range(27) if i % 4 == 0])  # the one-image questions, every 4th
    record = splits["test"][0]
    assert record.answer == "red" and record.columns["source"] == "example" and len(record.images) == 1
    # train and test given one by one: the folder's split of that name
    by_file, _ = user_data.user_records(files(train=str(path), test=str(path)), seed=0)
    assert [r.key for r in by_file["test"]] == [r.key for r in splits["test"]]


def test_parquet_files_and_one_dataset_are_one_set_split_by_the_seed(tmp_path):
    import datasets

    folder = write_dataset(tmp_path, rows=40)
    one = tmp_path / "one"
    datasets.load_from_disk(str(folder))["train"].save_to_disk(str(one))
    splits, details = user_data.user_records(files(path=str(one)), seed=0)
    assert details["all"]["rows"] == len(splits["train"]) + len(splits["test"]) and "seeded" in details["all"]["split"]
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    datasets.load_from_disk(str(folder))["train"].to_parquet(str(parquet / "train-00000.parquet"))
    datasets.load_from_disk(str(folder))["test"].to_parquet(str(parquet / "test-00000.parquet"))
    from_parquet, details = user_data.user_records(files(path=str(parquet)), seed=0)
    assert [r.key for r in from_parquet["test"]] == [r.key for r in user_data.user_records(
        files(path=str(folder)), seed=0)[0]["test"]]
    assert details["train"]["skipped"] == {"missing_answer": 1}


def test_column_names_are_settings_and_a_missing_column_is_a_clear_error(tmp_path):
    path = write_dataset(tmp_path, rows=12)
    with pytest.raises(UserDataError, match=r"no column\(s\) \['prompt'\].*question_column"):
        user_data.user_records(files(path=str(path), question_column="prompt"), seed=0)
    splits, _ = user_data.user_records(files(path=str(path), answer_column="source"), seed=0)
    assert {r.answer for r in splits["test"]} <= {"example", "generated"}


def test_nothing_usable_is_an_error_naming_the_file_and_why(tmp_path):
    write_jsonl(tmp_path, rows=3, bad=True)
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("\n".join((tmp_path / "vqa.jsonl").read_text().splitlines()[3:]) + "\n")
    with pytest.raises(UserDataError, match=r"bad\.jsonl: no usable row \(skipped: .*bad_json.*e\.g\. bad\.jsonl line"):
        user_data.user_records(jsonl_files(only_bad), seed=0)
    with pytest.raises(UserDataError, match="no such file"):
        user_data.user_records(files(path=str(tmp_path / "none.jsonl")), seed=0)
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(UserDataError, match=r"list\.json: a file that is neither a \.jsonl"):
        user_data.user_records(files(path=str(tmp_path / "list.json")), seed=0)
    with pytest.raises(UserDataError, match="either path, or train and test"):
        user_data.user_records(files(path="a.jsonl", train="b.jsonl"), seed=0)


def test_the_files_reach_the_shards_and_the_env_serves_them(tmp_path):
    path = write_jsonl(tmp_path / "mine", rows=40)
    data = DataParams(sections={"user_data": jsonl_files(path)})
    _, shards, manifest = build_shards(tmp_path, data, "user_data")
    assert manifest["dataset"] == "user_data"
    assert manifest["splits"]["train"]["kept"] == 36 and manifest["splits"]["test"]["kept"] == 4
    env = envs.make("user_data", shards_dir=str(shards), split="train")
    counts = {len(env.samples[i].images) for i in range(len(env))}
    assert counts == {1, 2}
    for idx in range(len(env)):
        state, obs = env.reset(idx)
        assert len(obs["images"]) == len(env.samples[idx].images)
        assert obs["messages"][0]["content"][-1]["text"] == state.meta["question"]
        assert env.step_text(state, env.sft_target(state.meta))[2] == 1.0


def test_without_files_the_demo_set_is_written():
    samples = ENV.generate(8, seed=3, split="train")
    assert [rewards.kind_of(s.meta["answer"]) for s in samples[:4]] == ["text", "number", "choice", "box"]


# --- named rewards -----------------------------------------------------------------------

S = rewards.Settings()
# (answer, truth) -> the value of each named reward
CASES = [
    # text
    (("Red.", "red"), {"exact": 1, "accuracy": 1, "format": 1, "numeric": 0, "choice": 0, "iou": 0}),
    (("**red**", "red"), {"exact": 1, "accuracy": 1, "format": 1}),
    (("blue", "red"), {"exact": 0, "accuracy": 0, "format": 1}),
    (("not red", "red"), {"exact": 0, "accuracy": 0}),
    # number
    (("3", "3"), {"exact": 1, "numeric": 1, "accuracy": 1, "format": 1, "choice": 0}),
    (("3.0", "3"), {"exact": 0, "numeric": 1, "accuracy": 1, "format": 1}),
    (("The answer is 3", "3"), {"numeric": 1, "format": 0}),
    (("3 3 3", "3"), {"numeric": 0, "accuracy": 0, "format": 0}),
    (("٣", "3"), {"numeric": 0, "exact": 0}),
    # choice
    (("B", "B"), {"choice": 1, "accuracy": 1, "exact": 1, "format": 1}),
    (("(b)", "B"), {"choice": 1, "accuracy": 1, "format": 1}),
    (("B. no", "B"), {"choice": 0, "accuracy": 0, "format": 0}),
    (("A or B", "B"), {"choice": 0}),
    # box
    (("[100, 100, 300, 300]", "[100, 100, 300, 300]"), {"iou": 1, "accuracy": 1, "format": 1}),
    (("[300, 300, 100, 100]", "[100, 100, 300, 300]"), {"iou": 1, "accuracy": 1}),  # corners swapped
    (("[100, 100, 200, 300]", "[100, 100, 300, 300]"), {"iou": 0.5, "accuracy": 0.5, "format": 1}),
    (("box: [100, 100, 300, 300]", "[100, 100, 300, 300]"), {"iou": 1, "format": 0}),
    (("[1e309, 0, 1e309, 300]", "[100, 100, 300, 300]"), {"iou": 0, "format": 0}),
]


@pytest.mark.parametrize("pair, expected", CASES, ids=[f"{a!r}-vs-{t!r}" for (a, t), _ in CASES])
def test_each_named_reward_on_the_same_inputs(pair, expected):
    answer, truth = pair
    for name, value in expected.items():
        assert rewards.score_named(name, answer, truth, S) == pytest.approx(value), name


def test_tolerances_and_thresholds():
    assert rewards.score_named("numeric", "3.04", "3", replace(S, numeric_tolerance=0.05)) == 1.0
    assert rewards.score_named("numeric", "3.04", "3", replace(S, numeric_relative_tolerance=0.01)) == 0.0
    assert rewards.score_named("numeric", "103", "100", replace(S, numeric_relative_tolerance=0.05)) == 1.0
    half = ("[100, 100, 200, 300]", "[100, 100, 300, 300]")
    assert rewards.score_named("iou", *half, replace(S, iou_threshold=0.5)) == 1.0
    assert rewards.score_named("iou", *half, replace(S, iou_threshold=0.75)) == 0.0
    # boxes keep the data's own units (no clipping to 0-1000)
    assert rewards.score_named("iou", "[1000, 1000, 3000, 3000]", "[1000, 1000, 3000, 3000]", S) == 1.0


# answers the junk gate stops before any reward reads them (the right answer among them, tagged or spammed)
GATED = ["", "   ", "red " * 1000, "<answer>red</answer>", "<think>red</think>", "\x00red", "🙂", "!!!", "red\ud800"]


# (rec's right answer holds the box [100, 100, 300, 300]: a right box in another form, so no truth here is that box)
@pytest.mark.parametrize("truth", ["red", "3", "B", "[400, 400, 600, 600]"])
def test_junk_gets_the_minimum_from_every_named_reward(truth):
    for text in [*adversarial("user_data"), *GATED, "[NaN, 1, 2, 3]", "[400, 400, 600]"]:
        if text.strip() == truth:
            continue
        for name in rewards.NAMED:
            value = rewards.score_named(name, text, truth, S)
            if name == "format" and rewards.is_junk(text) is False:
                assert 0.0 <= value <= 1.0  # format pays a well-formed wrong answer: that is what it measures
                continue
            assert value == 0.0, (name, truth, text[:60])
    for text in GATED:
        assert rewards.is_junk(text), text[:40]


def _samples(answers: list[str]) -> list[Sample]:
    from PIL import Image

    return [Sample(f"s{i}", [Image.new("RGB", (8, 6))], {"id": f"s{i}", "question": "Q?", "answer": a,
                                                         "columns": {"solution": a, "problem": "Q?", "n": i}})
            for i, a in enumerate(answers)]


def _env(rewards_setting: dict, answers=("red", "3", "B", "[100, 100, 300, 300]"), **params):
    settings = from_dict(EnvParams, {"name": "user_data", "user_data": {"rewards": rewards_setting, **params}})
    return ENV(samples=_samples(list(answers)), params=settings.settings())


def test_the_reward_is_the_weighted_mean_of_the_named_rewards():
    env = _env({"exact": 3.0, "format": 1.0})
    state, _ = env.reset(0)
    reward, info = env.step_text(state, "blue")[2::2]
    assert reward == pytest.approx(0.25) and info["reward_components"] == {"exact": 0.0, "format": 1.0}
    assert env.step_text(state, "red")[2] == 1.0 and env.step_text(state, "")[2] == 0.0


def test_fuzz_rewards_stay_in_range_and_never_raise():
    env = _env({"accuracy": 1.0, "format": 0.5, "iou": 0.1, "numeric": 0.1, "choice": 0.1, "exact": 0.1})
    states = [env.reset(i)[0] for i in range(len(env))]
    rng = random.Random(0)
    pieces = ["[", "]", ",", "1", "0", "-", "e", "9", "red", "B", "(", ")", ".", " ", "\n", "<answer>", "数", "1e309"]
    for i in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        reward, info = env.step_text(states[i % len(states)], text)[2::2]
        assert 0.0 <= reward <= 1.0 and isinstance(info["format_ok"], bool), text


def test_params_refuse_unknown_rewards_and_bad_weights():
    with pytest.raises(ParamsError, match=r"rewards\.exactly: unknown reward"):
        from_dict(EnvParams, {"name": "user_data", "user_data": {"rewards": {"exactly": 1.0}}})
    with pytest.raises(ParamsError, match="sum to 0"):
        from_dict(EnvParams, {"name": "user_data", "user_data": {"rewards": {"exact": 0.0}}})
    with pytest.raises(ParamsError, match=r"rewards\.exact: weight"):
        from_dict(EnvParams, {"name": "user_data", "user_data": {"rewards": {"exact": -1.0}}})


# --- TRL-style reward functions ------------------------------------------------------------

FUNCTIONS = '''
calls = []


def starts_like_solution(completions, solution, **kwargs):
    """TRL's signature; VLM-R1's chat form: completion[0]["content"]."""
    calls.append({"completions": completions, "solution": solution, **kwargs})
    return [float(c[0]["content"].strip()[:1].lower() == s[:1].lower()) for c, s in zip(completions, solution)]


def plain_text(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def raises(completions, **kwargs):
    raise RuntimeError("no reward today")


def two_values(completions, **kwargs):
    return [1.0, 0.0]


def not_finite(completions, **kwargs):
    return [float("nan")]


def fails_on_x(completions, **kwargs):
    if "x" in completions[0][0]["content"]:
        raise KeyError("x")
    return [1.0]
'''


@pytest.fixture
def functions_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_a_trl_function_gets_the_completions_and_the_rows_columns_as_lists(functions_module):
    env = _env({"exact": 1.0, "my_rewards:starts_like_solution": 1.0})
    module = sys.modules["my_rewards"]
    module.calls.clear()
    state, _ = env.reset(0)
    reward, info = env.step_text(state, "rose")[2::2]
    assert info["reward_components"] == {"exact": 0.0, "my_rewards.starts_like_solution": 1.0, FAILED: 0.0}
    assert reward == pytest.approx(0.5)
    assert module.calls == [{"completions": [[{"role": "assistant", "content": "rose"}]], "solution": ["red"],
                             "prompts": [[{"role": "user", "content": "Q?"}]], "problem": ["Q?"], "n": [0]}]
    # junk never reaches the function: it gets the minimum
    module.calls.clear()
    assert env.step_text(state, "   ")[2] == 0.0 and module.calls == []
    text = _env({"my_rewards:plain_text": 1.0}, completions="text")
    assert text.step_text(text.reset(0)[0], "abcde")[2] == pytest.approx(0.5)


@pytest.mark.parametrize("function, message", [
    ("raises", r"'my_rewards:raises' raised RuntimeError: no reward today"),
    ("two_values", r"'my_rewards:two_values' returned 2 values for 1 completion"),
    ("not_finite", r"'my_rewards:not_finite' returned nan, not a finite number"),
    ("absent", r"'my_rewards:absent': cannot load it"),
])
def test_a_broken_function_stops_the_env_build_naming_it(functions_module, function, message):
    with pytest.raises(RewardFunctionError, match=message):
        _env({"exact": 1.0, f"my_rewards:{function}": 1.0})


def test_a_function_failing_mid_run_scores_zero_and_says_so(functions_module, caplog):
    env = _env({"exact": 1.0, "my_rewards:fails_on_x": 1.0})
    state, _ = env.reset(0)
    reward, info = env.step_text(state, "red x")[2::2]
    assert reward == 0.0 and info["reward_components"][FAILED] == 1.0
    assert "KeyError" in info["reward_errors"]["my_rewards:fails_on_x"]
    assert "'my_rewards:fails_on_x' raised KeyError" in caplog.text
    assert env.step_text(state, "red")[4]["reward_components"][FAILED] == 0.0


# --- the page ------------------------------------------------------------------------------


def doc_blocks(language: str) -> list[str]:
    text = DOC.read_text()
    return [block.split("```", 1)[0] for block in text.split(f"```{language}\n")[1:]]


def test_the_pages_jsonl_example_is_what_the_tests_read():
    shown = [json.loads(line) for line in doc_blocks("json")[0].splitlines() if line.strip()]
    assert shown == EXAMPLE_LINES


def test_the_pages_settings_are_valid_params():
    for block in doc_blocks("yaml"):
        settings = yaml.safe_load(textwrap.dedent(block))
        if "env" in settings:
            from_dict(EnvParams, {"name": "user_data", **{k: v for k, v in settings["env"].items() if k != "name"}})
        if "data" in settings:
            from_dict(DataParams, settings["data"])


def test_a_sample_shows_one_to_four_images():
    from PIL import Image

    image = Image.new("RGB", (8, 6))
    for count in (1, 4):
        ENV(samples=[Sample("s", [image] * count, {"question": "Q?", "answer": "red"})])
    with pytest.raises(ValueError, match=r"sample 's' has 5 images, expected 1 to 4"):
        ENV(samples=[Sample("s", [image] * 5, {"question": "Q?", "answer": "red"})])
