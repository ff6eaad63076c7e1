"""The evaluation pieces the rollout and evaluate stages are built from: batched answering, HF-baseline agreement,
extra report sections, and reading the training curves from the train stage's curve file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from vlmgym.envs.nlvr2 import NLVR2Env
from vlmgym.eval.hf_baseline import token_agreement
from vlmgym.eval.report import sections_markdown
from vlmgym.eval.rollouts import answer_split
from vlmgym.models.qwen3_vl.hf_reference import answer_through_eos

EOS = 9


@dataclass
class FakeState:
    key: str
    meta: dict


@dataclass
class FakeEnv:
    """nlvr2-shaped: the answer is "True" when the first token is even."""

    keys: list[str]
    name: str = "nlvr2"
    scored: list = field(default_factory=list)
    # nlvr2's rollout record schema (answer_split builds each record with the env's class)
    record_fields = NLVR2Env.record_fields
    finish_record = NLVR2Env.finish_record

    def __len__(self) -> int:
        return len(self.keys)

    def reset(self, idx: int):
        meta = {"label": idx % 2 == 0, "sentence": f"s{idx}"}
        return FakeState(self.keys[idx], meta), {"messages": [], "images": [], "idx": idx}

    def step(self, state, tokens):
        self.scored.append((state.key, list(tokens)))
        word = "True" if tokens[0] % 2 == 0 else "False"
        reward = float((word == "True") == state.meta["label"])
        return state, [], reward, True, {"answer": word, "format_ok": True, "reward_components": {"acc": reward}}


class FakeEngine:
    """Answers prompt p, member m with tokens [idx + m, EOS] padded to 4; records the batch sizes it was given."""

    def __init__(self):
        self.calls = []

    def generate(self, params, observations, group_size, key):
        self.calls.append(len(observations))
        rows = [(obs["idx"], m) for obs in observations for m in range(group_size)]
        ids = np.full((len(rows), 4), 0, np.int32)
        for r, (idx, m) in enumerate(rows):
            ids[r, :2] = [idx + m, EOS]
        return SimpleNamespace(completion_ids=ids, lengths=np.full(len(rows), 2, np.int32),
                               texts=[f"t{idx}.{m}" for idx, m in rows], finish_reasons=["eos"] * len(rows))


def test_answer_split_pads_batches_and_keeps_sample_order():
    env, engine = FakeEnv([f"k{i}" for i in range(5)]), FakeEngine()
    records, timing = answer_split(engine, None, env, policy="grpo", batch_size=2, show_progress=False)
    assert engine.calls == [2, 2, 2]  # the short last batch is padded, so the engine compiles one shape
    assert [r["id"] for r in records] == [f"k{i}" for i in range(5)]
    assert [r["tokens"] for r in records] == [[i, EOS] for i in range(5)]
    assert [r["reward"] for r in records] == [1.0] * 5  # even idx -> True -> label True; odd -> False
    assert all(r["policy"] == "grpo" and r["finish_reason"] == "eos" and "sample" not in r for r in records)
    assert (timing.samples, timing.answers, timing.generated_tokens) == (5, 5, 10)


def test_answer_split_sampled_groups_need_a_key_and_number_members():
    env = FakeEnv(["a", "b", "c"])
    with pytest.raises(ValueError, match="random key"):
        answer_split(FakeEngine(), None, env, policy="sft", batch_size=2, group_size=2, show_progress=False)
    records, _ = answer_split(FakeEngine(), None, env, policy="sft", batch_size=2, group_size=2,
                              key=jax.random.key(1), show_progress=False)
    assert [(r["id"], r["sample"]) for r in records] == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]


def test_token_agreement_counts_positions_of_the_longer_answer():
    out = token_agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6, 7]])
    assert out["greedy_token_agreement"] == pytest.approx(4 / 6)
    assert out["greedy_exact_match"] == 0.5 and out["greedy_first_divergence"] == 1.0
    assert token_agreement([[1, EOS]], [[1, EOS]])["greedy_token_agreement"] == 1.0
    with pytest.raises(ValueError):
        token_agreement([[1]], [])


def test_answer_through_eos_keeps_the_end_token_and_drops_padding():
    assert answer_through_eos([5, 6, EOS, 0, 0], [EOS, 10]) == [5, 6, EOS]
    assert answer_through_eos([5, 6], [EOS]) == [5, 6]


def test_sections_markdown_renders_each_figure():
    text = sections_markdown({"hf_baseline": {"greedy_token_agreement": 1.0, "hf_tokens_per_s": 123.456,
                                              "max_abs_logit_diff": 1.2e-6}})
    assert "## hf_baseline" in text and "| greedy_token_agreement | 1 |" in text
    assert "| hf_tokens_per_s | 123.5 |" in text and "| max_abs_logit_diff | 1.2e-06 |" in text


def test_extra_metrics_may_not_shadow_a_policy(tmp_path):
    from vlmgym.eval.outputs import write_evaluation

    with pytest.raises(ValueError, match="clash"):
        write_evaluation("nlvr2", {"grpo": []}, {}, out_root=tmp_path, extra_metrics={"grpo": {"x": 1.0}})


def test_train_curve_is_read_from_the_train_stages_curve_file(tmp_path):
    from vlmgym.eval.curve import train_curves, train_reward_curve
    from vlmgym.tracking.step_curve import write_curve

    path = write_curve(tmp_path / "metrics/curves/train.jsonl",
                       {3: {"reward_mean": 0.4}, 1: {"reward_mean": 0.1}, 0: {"val/reward_greedy": 0.25},
                        2: {"reward_mean": 0.2, "val/reward_greedy": 0.5}})
    curve = train_reward_curve(path, "reward_mean")
    assert curve == [(1, 0.1), (2, 0.2), (3, 0.4)]  # by step, only the steps that hold it
    assert train_curves(path, ["val/reward_greedy", "reward/k_city"]) == {"val/reward_greedy": [(0, 0.25), (2, 0.5)]}
    assert train_reward_curve(tmp_path / "absent.jsonl", "reward_mean") == []
    assert json.dumps(curve)  # plain numbers, ready for the CSV writer


def test_reward_curves_headline_final_weights_beside_the_reward_as_trained(tmp_path):
    from vlmgym.eval.curve import reward_curves
    from vlmgym.tracking.step_curve import write_curve

    env = SimpleNamespace(reward_levels={})

    def written(metrics: dict) -> str:
        steps = {step: {name: values[step - 1] for name, values in metrics.items()} for step in (1, 2)}
        return str(write_curve(tmp_path / "train.jsonl", steps))

    curves = reward_curves(env, written({"reward_mean": [0.5, 0.4], "final_reward_mean": [0.2, 0.3]}),
                           "final_reward_mean")
    assert curves.total == [(1, 0.2), (2, 0.3)] and curves.as_trained == [(1, 0.5), (2, 0.4)]
    # no curriculum: one curve
    curves = reward_curves(env, written({"reward_mean": [0.2, 0.3], "final_reward_mean": [0.2, 0.3]}),
                           "final_reward_mean")
    assert curves.total == [(1, 0.2), (2, 0.3)] and curves.as_trained == []
    # a trainer that logs no final_reward_mean: its one curve
    curves = reward_curves(env, written({"reward_mean": [0.1, 0.6]}), "final_reward_mean")
    assert curves.total == [(1, 0.1), (2, 0.6)] and curves.as_trained == []
