"""metrics/headline.json: the few figures the pipeline declares as its DVC metrics (metrics/eval.json holds every
one), chosen from what the evaluate stage computes for any env, and the same figures on the pipeline's parent run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from vlmgym.envs import registry
from vlmgym.eval.outputs import (
    headline_figures,
    headline_metrics,
    headline_values,
    main_metric,
    mlflow_metrics,
    write_evaluation,
)
from vlmgym.eval.records import write_metrics_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from colour_env import COLOURS, ColourEnv  # noqa: E402
from test_blind_baselines import records  # noqa: E402  (the same colour answers, scored as the rollout stage writes them)

REPO = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).parent / "dvc"
WIDTH = 200  # columns `dvc metrics show` may take for the headline


def figures(reward: float, low: float, high: float, **more: float) -> dict[str, float]:
    return {"n": 1000.0, "mean_reward": reward, "mean_reward_ci_low": low, "mean_reward_ci_high": high,
            "format_valid_rate": 0.99812, "format_valid_rate_ci_low": 0.99501, "format_valid_rate_ci_high": 1.0,
            **more}


def default_results(score: str) -> dict[str, dict[str, float]]:
    """Results shaped as the default pipeline's metrics/eval.json (three policies, grpo - sft, the constant and
    blanked-image baselines), with the widest values each figure takes as `dvc metrics show` prints it: rewards in
    [0, 1], differences below 0, a score in the thousands."""
    big = {score: 4570.99787123, f"{score}_ci_low": 4475.2392, f"{score}_ci_high": 4669.8084}
    return {"base": figures(0.03212345, 0.02901234, 0.03498765, **big),
            "sft": figures(0.30392345, 0.29012345, 0.31768765, **big),
            "grpo": figures(0.30841085, 0.29618756, 0.32163053, **big),
            "constant": figures(0.14928384, 0.13212345, 0.16576543),
            "sft_blind": figures(0.10000012, 0.09212345, 0.10876543),
            "grpo_blind": figures(0.10000012, 0.09212345, 0.10876543),
            "grpo_minus_sft": figures(-0.00451182, -0.00924687, -0.00152055, **big),
            "sft_minus_constant": figures(-0.15463959, -0.16947332, -0.14017731),
            "sft_minus_sft_blind": figures(-0.20392333, -0.21834567, -0.18876543),
            "grpo_minus_constant": figures(0.15912701, 0.14412701, 0.17412701),
            "grpo_minus_grpo_blind": figures(0.20841073, 0.19341073, 0.22341073),
            "hf_baseline": {"greedy_token_agreement": 1.0, "max_abs_logit_diff": 8.58e-06}}


BASELINES = ["constant", "sft_blind", "grpo_blind"]


def test_the_headline_holds_each_policys_reward_the_comparison_the_blind_margins_format_and_main_score():
    results = default_results("geoscore")
    chosen = headline_figures(registry.env_class("geospot"), results, ["base", "sft", "grpo"], [("grpo", "sft")],
                              BASELINES)
    assert chosen == {
        "base": ("base", "mean_reward"),
        "sft": ("sft", "mean_reward"), "sft_lo": ("sft", "mean_reward_ci_low"),
        "sft_hi": ("sft", "mean_reward_ci_high"),
        "grpo": ("grpo", "mean_reward"), "grpo_lo": ("grpo", "mean_reward_ci_low"),
        "grpo_hi": ("grpo", "mean_reward_ci_high"),
        "grpo-sft": ("grpo_minus_sft", "mean_reward"), "grpo-sft_lo": ("grpo_minus_sft", "mean_reward_ci_low"),
        "grpo-sft_hi": ("grpo_minus_sft", "mean_reward_ci_high"),
        "sft-constant": ("sft_minus_constant", "mean_reward"), "sft-sft_blind": ("sft_minus_sft_blind", "mean_reward"),
        "format_valid": ("grpo", "format_valid_rate"),
        "geoscore": ("grpo", "geoscore"),
    }
    values = headline_values(results, chosen)
    assert values["grpo-sft_lo"] == results["grpo_minus_sft"]["mean_reward_ci_low"]
    assert values["geoscore"] == results["grpo"]["geoscore"] and values["base"] == results["base"]["mean_reward"]


def test_an_envs_main_score_is_the_one_its_correct_answers_are_counted_by_else_its_reports_first_row():
    for name in registry.names():
        env = registry.env_class(name)
        expected = env.solved_metric or next(iter(env.metric_rows), "")
        assert main_metric(env) == expected
    assert main_metric(registry.env_class("geospot")) == "geoscore"  # no solved bit: the report's first row
    assert main_metric(registry.env_class("rec")) == "accuracy_iou50"  # its solved bit, before mean IoU


def test_without_comparisons_every_policy_gets_its_interval_and_the_last_one_leads():
    results = {p: figures(0.5, 0.4, 0.6) for p in ("base", "sft")}
    chosen = headline_figures(ColourEnv, results, ["base", "sft"], [("grpo", "sft")])  # grpo was not evaluated
    assert list(chosen) == ["base", "base_lo", "base_hi", "sft", "sft_lo", "sft_hi", "format_valid"]
    assert chosen["format_valid"] == ("sft", "format_valid_rate")  # ColourEnv's accuracy is not in these results


def test_a_policy_named_like_a_headline_figure_is_refused():
    results = {p: figures(0.5, 0.4, 0.6) for p in ("sft", "format_valid")}
    with pytest.raises(ValueError, match="'format_valid' names both"):
        headline_figures(ColourEnv, results, ["sft", "format_valid"])


def metrics_show(folder: Path, headline: dict) -> list[str]:
    """`dvc metrics show`'s lines for a DVC project whose only metrics file is `headline`, declared as dvc.yaml's
    evaluate stage declares its metrics."""
    evaluate = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["evaluate"]
    write_metrics_json(folder / "metrics" / "headline.json", headline)
    stage = {"cmd": "true", "metrics": evaluate["metrics"]}
    (folder / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"evaluate": stage}}))
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=folder, check=True)
    shown = subprocess.run([str(DVC), "metrics", "show"], cwd=folder, check=True, capture_output=True, text=True)
    return shown.stdout.splitlines()


@pytest.mark.parametrize("env_name", ["geospot", "longest score name"])
def test_dvc_metrics_show_prints_the_default_pipelines_headline_in_200_columns(tmp_path, env_name):
    if env_name == "longest score name":
        env_name = max(registry.names(), key=lambda name: len(main_metric(registry.env_class(name))))
    env = registry.env_class(env_name)
    results = default_results(main_metric(env))
    chosen = headline_figures(env, results, ["base", "sft", "grpo"], [("grpo", "sft")], BASELINES)
    assert len(chosen) == 14
    lines = metrics_show(tmp_path, headline_values(results, chosen))
    assert lines[0].split()[0] == "Path" and lines[1].split()[0] == "metrics/headline.json"
    assert len(lines[0].split()) == len(chosen) + 1  # every figure is a column
    assert max(len(line) for line in lines) <= WIDTH, "\n".join(lines)


def colour_evaluation(out_root: Path):
    rng = np.random.default_rng(0)
    colours = [sorted(COLOURS)[int(i)] for i in rng.integers(4, size=40)]
    policies = {"base": records(["blue"] * 40, colours, "base"),
                "sft": records(colours[:30] + ["blue"] * 10, colours, "sft"),
                "grpo": records(colours, colours, "grpo")}
    baselines = {name: records(["blue"] * 40, colours, name) for name in BASELINES}
    images = {r["id"]: [Image.new("RGB", (8, 6))] for r in policies["sft"]}
    return write_evaluation(ColourEnv, policies, images, out_root=out_root, n_resamples=50,
                            baseline_records=baselines, start_policies=["base"])


def test_the_evaluate_stage_writes_the_headline_beside_every_figure_and_names_them_for_the_parent_run(tmp_path):
    outputs = colour_evaluation(tmp_path)
    assert outputs.files["headline"] == tmp_path / "metrics" / "headline.json"
    headline = json.loads(outputs.files["headline"].read_text())
    everything = json.loads(outputs.files["metrics"].read_text())
    assert list(headline) == ["base", "sft", "sft_lo", "sft_hi", "grpo", "grpo_lo", "grpo_hi", "grpo-sft",
                              "grpo-sft_lo", "grpo-sft_hi", "sft-constant", "sft-sft_blind", "format_valid",
                              "accuracy"]
    assert headline["grpo-sft"] == everything["grpo_minus_sft"]["mean_reward"] > 0
    assert headline["sft-constant"] == everything["sft_minus_constant"]["mean_reward"]
    assert headline["accuracy"] == everything["grpo"]["accuracy"] == 1.0
    # The parent run gets these figures under the evaluate run's own names, and nothing else
    parent = headline_metrics(outputs)
    logged = mlflow_metrics(outputs.results)
    assert len(parent) == len(headline) and all(logged[name] == value for name, value in parent.items())
    assert parent["grpo_minus_sft/mean_reward_ci_low"] == headline["grpo-sft_lo"]
    assert parent["grpo/accuracy"] == headline["accuracy"] and len(logged) > 8 * len(parent)


def test_an_env_made_of_several_gets_one_headline_per_sub_env(tmp_path):
    from vlmgym import envs
    from vlmgym.eval.parts import evaluate_parts
    from vlmgym.params import EnvParams, EvalParams, ModelParams, RolloutParams

    def evaluate_env(eval_params, rollout, model, env_params, train_curve, out_root, curve_prefix, data):
        return colour_evaluation(Path(out_root)), {}

    env_params = EnvParams(name="mixture")
    outputs, _ = evaluate_parts(EvalParams(), RolloutParams(), ModelParams(), env_params, tmp_path / "none.jsonl",
                                evaluate_env, out_root=tmp_path)
    names = envs.parts(env_params)
    headline = json.loads((tmp_path / "metrics" / "headline.json").read_text())
    everything = json.loads((tmp_path / "metrics" / "eval.json").read_text())
    assert list(headline) == names and all(len(headline[name]) == 14 for name in names)
    first = names[0]
    assert headline[first]["grpo-sft"] == everything[first]["grpo_minus_sft"]["mean_reward"]
    parent = headline_metrics(outputs)
    assert parent[f"{first}/grpo_minus_sft/mean_reward"] == headline[first]["grpo-sft"]
    assert len(parent) == 14 * len(names)


def test_the_evaluate_stage_gives_its_own_run_every_figure_and_the_pipelines_parent_run_the_headline(
        tmp_path, monkeypatch):
    import contextlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_stage", REPO / "stages" / "evaluate.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    outputs = colour_evaluation(tmp_path / "out")
    logged: dict[str, dict] = {"run": {}, "parent": {}}

    class FakeRun:
        def log_metrics(self, metrics, step=None):
            logged["run"].update(metrics)

        def log_pipeline_results(self, metrics):
            logged["parent"].update(metrics)

        def log_artifact(self, path, artifact_path=None):
            pass

    @contextlib.contextmanager
    def fake_stage_run(name, params, params_file=None, extra_params=None):
        yield FakeRun()

    monkeypatch.setattr(stage.tracking, "stage_run", fake_stage_run)
    monkeypatch.setattr(stage, "evaluate_pipeline", lambda *args, **kwargs: (outputs, {}))
    monkeypatch.setattr(stage.registry, "promote_evaluated", lambda *args, **kwargs: None)
    (tmp_path / "params.yaml").write_text("eval:\n  hf_samples: 0\n")
    assert stage.main(["--params", str(tmp_path / "params.yaml")]) == 0
    assert logged["run"] == mlflow_metrics(outputs.results)
    assert logged["parent"] == headline_metrics(outputs) and len(logged["parent"]) == 14


def test_the_terminal_summary_gives_each_interval_once_and_points_to_the_report():
    from vlmgym.eval.outputs import headline_summary

    values = {"base": 0.0, "sft": 0.224, "sft_lo": 0.2, "sft_hi": 0.25, "grpo": 0.186, "grpo_lo": 0.165,
              "grpo_hi": 0.208, "grpo-sft": -0.038, "grpo-sft_lo": -0.073, "grpo-sft_hi": -0.005,
              "sft-constant": 0.039, "format_valid": 1.0, "geoscore": 923.1}
    lines = headline_summary(values, "reports/eval.md").splitlines()
    assert lines[1:4] == ["  sft              0.224 [0.200, 0.250]", "  grpo             0.186 [0.165, 0.208]",
                          "  grpo-sft         -0.038 [-0.073, -0.005]"]
    assert lines[4] == "  base 0.000, sft-constant +0.039, format_valid 1.000, geoscore 923"
    assert lines[-1] == "every metric, interval and check: reports/eval.md" and len(lines) == 6
    assert not any("_lo" in line or "_hi" in line for line in lines)
