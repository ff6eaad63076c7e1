"""Your own data through the whole pipeline with no code: docs/envs/user_data.md's settings on the micro preset, one
`dvc repro` on a VLM-R1 jsonl, then one on a `datasets` folder with the page's rewards (a TRL-style function of
plugins/_rewards.py among them), as the page shows them."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from pipeline_helpers import REPO, STAGES, micro_checkout, read_records, run_checked, stages_run
from shared_setup import shared_across_workers

sys.path.insert(0, str(REPO / "tests" / "envs"))
from user_data_files import BAD_REASONS, write_dataset, write_jsonl  # noqa: E402

DOC = REPO / "docs" / "envs" / "user_data.md"


def blocks(language: str) -> list[str]:
    """The page's code blocks of one language, in order."""
    return [textwrap.dedent(b.split("```", 1)[0]) for b in DOC.read_text().split(f"```{language}\n")[1:]]


def _outputs(root: Path) -> dict:
    return {"manifest": json.loads((root / "data" / "shards" / "manifest.json").read_text()),
            "eval": json.loads((root / "metrics" / "eval.json").read_text()),
            "md": (root / "reports" / "eval.md").read_text(), "html": (root / "reports" / "eval.html").read_text(),
            "records": read_records(root / "outputs" / "rollouts" / "grpo.jsonl")}


def _build(root: Path) -> dict:
    env = micro_checkout(root)
    write_jsonl(root / "mydata", rows=48)
    write_dataset(root / "mydata", rows=60)
    (root / "plugins" / "_rewards.py").write_text(blocks("python")[0])
    jsonl, dataset, rewards = (yaml.safe_load(b) for b in blocks("yaml"))
    runs = {}
    for name, overlay in (("jsonl", jsonl), ("dataset", {"env": rewards["env"], "data": dataset["data"]})):
        (root / "overlay.yaml").write_text(yaml.safe_dump(overlay))
        run_checked(["vlmgym", "preset", "overlay.yaml", "--on-top"], root, env)
        run_checked(["git", "add", "-A"], root, env)
        run_checked(["git", "commit", "-qm", f"user data: {name}"], root, env)
        output = run_checked(["dvc", "repro"], root, env).stdout
        runs[name] = {"stages": stages_run(output), **_outputs(root)}
    return {"root": str(root), "runs": runs}


@pytest.fixture(scope="module")
def user_data_runs(tmp_path_factory):
    return shared_across_workers(tmp_path_factory, "user-data-pipeline", _build)["runs"]


def test_a_jsonl_and_a_datasets_folder_run_through_every_stage(user_data_runs):
    jsonl, dataset = user_data_runs["jsonl"], user_data_runs["dataset"]
    assert jsonl["stages"] == STAGES
    # the second set: new data and new rewards; base_model reran on the new env section and wrote the same model
    # (the tokenizer's texts are the env class's), so convert had nothing new to convert
    assert dataset["stages"] == [stage for stage in STAGES if stage != "convert"]
    # the jsonl: 48 good lines, a seeded test tenth; the bad lines were skipped at download
    manifest = jsonl["manifest"]
    assert manifest["dataset"] == "user_data" and manifest["splits"]["test"]["kept"] == 5
    assert manifest["splits"]["train"]["kept"] + manifest["splits"]["val"]["kept"] == 43
    assert sum(BAD_REASONS.values()) == 5
    # the datasets folder: its own train and test splits (every 4th of the 40 one-image questions is test)
    assert dataset["manifest"]["splits"]["test"]["kept"] == 10


def test_the_evaluate_report_holds_the_envs_metrics(user_data_runs):
    for run in user_data_runs.values():
        metrics = run["eval"]
        for policy in ("base", "sft", "grpo", "constant", "sft_blind", "grpo_blind"):
            assert 0 <= metrics[policy]["accuracy"] <= 1, policy
        assert "accuracy" in metrics["grpo_minus_sft"]
        assert "| accuracy (exact, numeric, letter; box: IoU >= 0.5) |" in run["md"]
        assert "<h2>Accuracy by answer kind</h2>" in run["html"] and "Environment <b>user_data</b>" in run["html"]
    assert any(name.startswith("accuracy_") for name in user_data_runs["jsonl"]["eval"]["grpo"])  # a kind's row


def test_the_pages_reward_function_scored_the_answers(user_data_runs):
    jsonl, dataset = user_data_runs["jsonl"]["records"], user_data_runs["dataset"]["records"]
    assert jsonl[0]["env"] == "user_data" and set(jsonl[0]["reward_components"]) == {"accuracy"}
    components = dataset[0]["reward_components"]
    assert set(components) == {"accuracy", "format", "plugins._rewards.short_answer", "reward_function_failed"}
    assert all(r["reward_components"]["reward_function_failed"] == 0.0 for r in dataset)
    assert set(dataset[0]["truth"]) == {"answer", "kind", "question"}
