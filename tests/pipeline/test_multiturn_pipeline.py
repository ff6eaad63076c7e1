"""A multi-turn env through the whole pipeline: digits with the zoom tool (configs/zoom.yaml) on the micro preset,
one `dvc repro`. SFT trains the ideal zoom and the answer as two turns, GRPO and the rollout stage play
episodes, and the evaluation reports their turns and tool calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import STAGES, env_pipeline, read_records, stages_run
from shared_setup import shared_across_workers

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def zoom_pipeline(tmp_path_factory):
    built = shared_across_workers(tmp_path_factory, "zoom-pipeline", _build)
    return Path(built["root"]), built["output"]


def _build(root: Path) -> dict:
    overlay = yaml.safe_load((REPO / "configs" / "zoom.yaml").read_text())
    overlay["env"].update(name="digits", recipe="digits")
    overlay["eval"] = {"hf_samples": 2}
    root, env, output = env_pipeline(root, overlay)
    return {"root": str(root), "output": output}


def test_every_stage_ran_with_two_turn_episodes(zoom_pipeline):
    root, output = zoom_pipeline
    assert stages_run(output) == STAGES
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["env"]["digits"]["tools"] == ["zoom"] and params["env"]["digits"]["max_turns"] == 2
    turns = [step["metrics"]["episode_turns"] for step in read_records(root / "metrics" / "curves" / "train.jsonl")
             if "episode_turns" in step["metrics"]]
    assert turns and all(1.0 <= t <= 2.0 for t in turns)
    # SFT's rows: the zoom call (~48 tokens) and the answer (a few), so a mean target near 25 tokens, not ~4
    lengths = [step["metrics"]["target_length"] for step in read_records(root / "metrics" / "curves" / "sft.jsonl")
               if "target_length" in step["metrics"]]
    assert lengths and all(15 < length < 40 for length in lengths)


def test_rollout_records_hold_the_episodes(zoom_pipeline):
    root, _ = zoom_pipeline
    for policy in ("base", "sft", "grpo"):
        records = read_records(root / "outputs" / "rollouts" / f"{policy}.jsonl")
        assert len(records) == 16
        for record in records:
            assert 1 <= record["episode_turns"] == len(record["turns"]) == len(record["turn_tokens"]) <= 2
            assert record["answer"] == record["turns"][-1]
            assert len(record["tool_calls"]) == record["episode_turns"] - 1


def test_the_evaluation_reports_turns_and_calls(zoom_pipeline):
    root, _ = zoom_pipeline
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    for policy in ("sft", "grpo"):
        assert 1.0 <= metrics[policy]["episode_turns"] <= 2.0
        assert "mean_reward_turns_1" in metrics[policy] or "mean_reward_turns_2" in metrics[policy]
    assert "episode_turns" in metrics["grpo_minus_sft"]
    assert metrics["hf_baseline"]["greedy_token_agreement"] == 1.0
    assert "| turns per episode |" in (root / "reports" / "eval.md").read_text()
