"""Multi-turn envs through the whole pipeline on the micro preset with its multi-turn overlay
(configs/micro_tools.yaml: turns long enough to hold a call, SFT long enough to learn it):

- digits with the zoom tool (configs/zoom.yaml), one `dvc repro`: SFT trains the ideal zoom and the answer as two
  turns, GRPO and the rollout stage play episodes, and the evaluation reports their turns and tool calls;
- docs/multi-turn.md's plug-in env with a tool of its own (tests/envs/mirror_env.py), run by the guide's own
  command: the tiny tokenizer learns the plug-in's tool and episodes take their second turn."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import STAGES, VENV_BIN, env_pipeline, micro_checkout, read_records, run_checked, stages_run
from shared_setup import shared_across_workers

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "multi-turn.md"
MIRROR_CALL = '<tool_call>\n{"name": "mirror", "arguments": {}}\n</tool_call>'


def micro_tools() -> dict:
    return yaml.safe_load((REPO / "configs" / "micro_tools.yaml").read_text())


@pytest.fixture(scope="module")
def zoom_pipeline(tmp_path_factory):
    built = shared_across_workers(tmp_path_factory, "zoom-pipeline", _build)
    return Path(built["root"]), built["output"]


def _build(root: Path) -> dict:
    overlay = yaml.safe_load((REPO / "configs" / "zoom.yaml").read_text())
    for section, keys in micro_tools().items():
        overlay.setdefault(section, {}).update(keys)
    overlay["env"].update(name="digits", recipe="digits")
    overlay["eval"] = {"hf_samples": 2}
    root, env, output = env_pipeline(root, overlay)
    return {"root": str(root), "output": output}


def test_micro_turns_hold_a_zoom_call():
    # the guide's figure: 36 tokens plus one per digit, at most 50, then <|im_end|>
    assert micro_tools()["train"]["max_new_tokens"] >= 51 and micro_tools()["rollout"]["max_new_tokens"] >= 51


def test_every_stage_ran_with_two_turn_episodes(zoom_pipeline):
    root, output = zoom_pipeline
    assert stages_run(output) == STAGES
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["env"]["digits"]["tools"] == ["zoom"] and params["env"]["digits"]["max_turns"] == 2
    assert params["train"]["max_new_tokens"] == params["rollout"]["max_new_tokens"] == 64
    turns = [step["metrics"]["episode_turns"] for step in read_records(root / "metrics" / "curves" / "train.jsonl")
             if "episode_turns" in step["metrics"]]
    assert turns and all(1.0 <= t <= 2.0 for t in turns)
    # a turn holds a call: GRPO's sampled episodes call zoom and go on (micro's 16-token turns cut every call)
    assert max(turns) > 1.0
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


# --- the guide's plug-in tool ----------------------------------------------------------------------------------


def guide_command() -> str:
    """The bash block of docs/multi-turn.md that runs the mirror example."""
    (command,) = [block for block in re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S) if "mirror_env" in block]
    return command


@pytest.fixture(scope="module")
def mirror_pipeline(tmp_path_factory):
    built = shared_across_workers(tmp_path_factory, "mirror-pipeline", _build_mirror)
    return Path(built["root"]), built["output"]


def _build_mirror(root: Path) -> dict:
    env = micro_checkout(root)
    (root / ".venv").symlink_to(VENV_BIN.parent)  # the guide's commands call .venv/bin/...
    (root / "quick.yaml").write_text(yaml.safe_dump({"eval": {"hf_samples": 2}}))  # a shorter transformers check
    run_checked(["vlmgym", "preset", "quick.yaml", "--on-top"], root, env)
    run_checked(["git", "add", "-A"], root, env)
    run_checked(["git", "commit", "-qm", "micro"], root, env)  # dvc exp run needs a commit to start from
    return {"root": str(root), "output": run_checked(["bash", "-ec", guide_command()], root, env).stdout}


def test_the_guide_command_runs_every_stage_on_the_plug_in(mirror_pipeline):
    root, output = mirror_pipeline
    assert stages_run(output) == STAGES
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["env"]["name"] == "mirror_env:MirrorColourEnv"
    from transformers import AutoTokenizer

    # base_model trained the tokenizer on the plug-in's own tool: the guide's 25 tokens for a mirror call
    assert len(AutoTokenizer.from_pretrained(root / "models" / "hf" / "base").tokenize(MIRROR_CALL)) == 25


def test_episodes_take_a_second_turn_with_the_plug_in_tool(mirror_pipeline):
    root, _ = mirror_pipeline
    records = read_records(root / "outputs" / "rollouts" / "sft.jsonl")
    assert all(len(record["tool_calls"]) == record["episode_turns"] - 1 for record in records)
    second = [record for record in records if record["episode_turns"] == 2]
    assert second, "no episode of the SFT policy took a second turn"
    for record in second:
        assert record["turns"][0].strip() == MIRROR_CALL  # greedy: the call SFT taught, word for word
        assert record["tool_calls"] == [{"turn": 0, "tool": "mirror", "ok": True, "error": None, "box": None,
                                         "reward": 0.0}]
    turns = [step["metrics"]["episode_turns"] for step in read_records(root / "metrics" / "curves" / "train.jsonl")
             if "episode_turns" in step["metrics"]]
    assert turns and max(turns) > 1.0  # GRPO's sampled episodes go on after a call too
    metrics = json.loads((root / "metrics" / "eval.json").read_text())
    assert metrics["sft"]["episode_turns"] > 1.0 and metrics["sft"]["tool_call_valid_rate"] > 0
