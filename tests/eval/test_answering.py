"""The answering the rollout stage and a study's stages share (vlmgym.eval.answering): each policy's greedy,
out-of-distribution, sampled and image-blind answers and the constant baseline, written where the evaluate stage
reads them, for one env and for each sub-env of a mixture; on docs/writing-an-env.md's colour env (a plug-in) with
an engine that names the colour it sees."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from vlmgym.data.shards import Sample
from vlmgym.envs.mixture import MixtureParams
from vlmgym.eval import answering
from vlmgym.eval.records import read_jsonl
from vlmgym.params import EnvParams, ModelParams, RolloutParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from colour_env import COLOURS, ColourEnv  # noqa: E402

WORDS = sorted(COLOURS)
# the colours of each split's samples: test's are all red but one, so an image-blind answer scores below a seeing one
SPLIT_COLOURS = {"test": ["red", "red", "blue", "red", "red"], "test_ood": ["green", "yellow", "green"],
                 "val": ["blue", "red", "red", "yellow"]}


class WordTokenizer:
    """Token k is the colour word WORDS[k]."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(WORDS[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [WORDS.index(word) for word in text.split()]


def seen_colour(image: Image.Image) -> str:
    """The colour nearest the image's first pixel (a grey, blanked image is nearest green)."""
    pixel = np.asarray(image.convert("RGB"))[0, 0].astype(float)
    return min(WORDS, key=lambda word: float(((np.asarray(COLOURS[word]) - pixel) ** 2).sum()))


class ColourEngine:
    """Answers each prompt with the colour of its image; a sampling engine's answer k > 0 is `red` instead."""

    def __init__(self, model_dir: str, sampling: bool = False):
        self.model_dir, self.sampling = model_dir, sampling
        self.processor = SimpleNamespace(tokenizer=WordTokenizer())

    def generate(self, params, observations, group_size, key):
        words = [seen_colour(obs["images"][0]) if member == 0 or not self.sampling else "red"
                 for obs in observations for member in range(group_size)]
        ids = np.array([[WORDS.index(word)] for word in words], np.int32)
        return SimpleNamespace(completion_ids=ids, lengths=np.ones(len(words), np.int32), texts=words,
                               finish_reasons=["eos"] * len(words))


@pytest.fixture
def faked(tmp_path, monkeypatch):
    """Every model folder opens as a ColourEngine and every split as a colour env; records what was opened."""
    opened = {"engines": [], "envs": []}
    shards = tmp_path / "shards"

    def open_engine(model_dir, rollout, model):
        opened["engines"].append(Path(model_dir).name)
        return ColourEngine(str(model_dir)), None

    def open_env(env_params, rollout, shards_dir, split, tokenizer, limit):
        opened["envs"].append((str(Path(shards_dir).relative_to(shards)), split, limit))
        colours = SPLIT_COLOURS[split][: limit or None]
        samples = [Sample(f"{split}{i}", [Image.new("RGB", (8, 6), COLOURS[c])], {"colour": c})
                   for i, c in enumerate(colours)]
        return ColourEnv(samples, tokenizer=tokenizer)

    monkeypatch.setattr(answering, "open_engine", open_engine)
    monkeypatch.setattr(answering, "open_env", open_env)
    monkeypatch.setattr(answering, "sampling_engine", lambda engine, rollout: ColourEngine(engine.model_dir, True))
    return SimpleNamespace(opened=opened, shards=shards, out=tmp_path / "rollouts")


def shard_folders(root: Path, splits=("test", "test_ood", "val")) -> None:
    for split in splits:
        (root / split).mkdir(parents=True)


def rollout_params(shards: Path, **changes) -> RolloutParams:
    settings = {"policies": ["base", "sft"], "blind_policies": ["sft"], "sampled_answers": 2, "batch_size": 2,
                "shards_dir": str(shards), **changes}
    return RolloutParams(**settings)


COLOUR_ENV = EnvParams(name="colour_env:ColourEnv")


def test_one_env_writes_each_policys_answers_where_the_evaluate_stage_reads_them(faked):
    shard_folders(faked.shards)
    answered = []
    summary = answering.answer_policies(rollout_params(faked.shards), ModelParams(), COLOUR_ENV, faked.out,
                                        on_answered=answered.append)
    written = sorted(p.relative_to(faked.out).as_posix() for p in faked.out.rglob("*.jsonl"))
    assert written == ["base.jsonl", "base.sampled.jsonl", "constant.jsonl", "sft.jsonl", "sft.sampled.jsonl",
                       "sft_blind.jsonl", "test_ood/base.jsonl", "test_ood/constant.jsonl", "test_ood/sft.jsonl",
                       "test_ood/sft_blind.jsonl"]
    assert faked.opened["engines"] == ["base", "sft"]  # each model once
    assert set(summary) == {"base", "sft", "sft_blind", "constant"}
    sft = summary["sft"]
    assert (sft["samples"], sft["answers"], sft["mean_reward"], sft["test_ood_mean_reward"]) == (5, 5, 1.0, 1.0)
    assert sft["test_ood_samples"] == 3 and sft["format_ok_rate"] == 1.0
    # two sampled answers per prompt: the first sees the colour, the second says red (right on 4 of 5)
    assert sft["sampled_mean_reward"] == pytest.approx((5 * 1.0 + 4 * 1.0 + 1 * 0.1) / 10)
    assert [r["sample"] for r in read_jsonl(faked.out / "sft.sampled.jsonl")] == [0, 1] * 5
    # blanked images look green: right only where the colour is green (test_ood's first and last)
    assert summary["sft_blind"]["mean_reward"] == pytest.approx(0.1)
    assert summary["sft_blind"]["test_ood_mean_reward"] == pytest.approx((1.0 + 0.1 + 1.0) / 3)
    assert [r["policy"] for r in read_jsonl(faked.out / "sft_blind.jsonl")] == ["sft_blind"] * 5
    # speeds go to MLflow only, never into the summary
    assert not any(key.endswith(("seconds", "tokens_per_s")) for figures in summary.values() for key in figures)
    assert [a.name for a in answered] == ["base", "sft", "sft_blind", "constant"]
    assert "sft/tokens_per_s" in answered[1].metrics() and "sft/mean_reward" in answered[1].metrics()


def test_the_constant_is_chosen_on_val_and_answers_every_split(faked):
    shard_folders(faked.shards)
    summary = answering.answer_policies(rollout_params(faked.shards), ModelParams(), COLOUR_ENV, faked.out)
    constant = summary["constant"]
    # val holds red twice, blue and yellow once: red has the best mean reward there
    assert (constant["answer"], constant["chosen_on"], constant["candidates"]) == ("red", "val", 3)
    assert constant["val_mean_reward"] == pytest.approx((2 * 1.0 + 2 * 0.1) / 4)
    assert constant["mean_reward"] == pytest.approx((4 * 1.0 + 0.1) / 5) and constant["samples"] == 5
    assert constant["test_ood_mean_reward"] == pytest.approx(0.1)
    assert {r["answer"] for r in read_jsonl(faked.out / "test_ood" / "constant.jsonl")} == {"red"}
    metrics = answering.Answered("", "constant", constant, {}, "test_ood").metrics()
    assert "constant/answer" not in metrics and metrics["constant/candidates"] == 3  # numbers only


def test_shards_without_the_ood_split_are_answered_in_distribution_only(faked, capsys):
    shard_folders(faked.shards, ("test", "val"))
    rollout = rollout_params(faked.shards, sampled_answers=0, constant_baseline=False)
    summary = answering.answer_policies(rollout, ModelParams(), COLOUR_ENV, faked.out)
    assert sorted(p.name for p in faked.out.iterdir()) == ["base.jsonl", "sft.jsonl", "sft_blind.jsonl"]
    assert set(summary) == {"base", "sft", "sft_blind"}
    assert "test_ood_mean_reward" not in summary["sft"] and "sampled_mean_reward" not in summary["sft"]
    assert "holds no test_ood split" in capsys.readouterr().out


def test_a_mixture_answers_each_sub_env_from_its_shards_into_its_own_folder(faked):
    names = ["digits", "message_decoding"]
    for name in names:
        shard_folders(faked.shards / name)
    mixture = EnvParams(name="mixture", sections={"mixture": MixtureParams(envs=dict.fromkeys(names, 1.0))})
    answered = []
    summary = answering.answer_policies(rollout_params(faked.shards, sampled_answers=0), ModelParams(), mixture,
                                        faked.out, on_answered=answered.append)
    assert set(summary) == set(names)
    assert all(set(summary[name]) == {"base", "sft", "sft_blind", "constant"} for name in names)
    for name in names:
        assert (faked.out / name / "sft.jsonl").is_file() and (faked.out / name / "test_ood" / "sft.jsonl").is_file()
    # each sub-env opened once for every policy, from its own shards
    assert [(where, split) for where, split, _ in faked.opened["envs"]
            if split in ("test", "test_ood")] == [(name, split) for name in names for split in ("test", "test_ood")]
    assert faked.opened["engines"] == ["base", "sft"]
    logged = {name for each in answered for name in each.metrics()}
    assert {"digits/sft/mean_reward", "message_decoding/constant/mean_reward"} <= logged
    assert "sft/mean_reward" not in logged  # every figure under its sub-env


def test_compare_answers_a_split_as_the_rollout_stage_does(faked):
    shard_folders(faked.shards)
    rollout = rollout_params(faked.shards, limit=3)
    answering.answer_policies(rollout, ModelParams(), COLOUR_ENV, faked.out)
    stage = read_jsonl(faked.out / "test_ood" / "sft.jsonl")
    assert answering.greedy_answers(Path("models/sft"), rollout, ModelParams(), COLOUR_ENV, "test_ood", "sft") == stage
    assert len(stage) == 3  # rollout.limit
    chosen = answering.choose_constant(rollout, COLOUR_ENV, rollout.shards_dir, WordTokenizer())
    assert chosen[:3] == ("red", pytest.approx(0.55), "val")
