"""The docs' study tables come from the studies' reports: a block renders a report's means, differences and
intervals (bold only where the t-interval excludes 0), `vlmgym study tables` rewrites a stale block and `--check`
finds one, and this repository's README and docs agree with its committed study reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vlmgym.compare import readme
from vlmgym.compare.study import tables

REPO = Path(__file__).resolve().parents[2]


def flat(mean, low, high, sampled=None):
    out = {"mean_reward": mean, "mean_reward_ci_low": low, "mean_reward_ci_high": high, "seeds": 5.0}
    for key, (value, lo, hi) in (sampled or {}).items():
        out.update({key: value, f"{key}_ci_low": lo, f"{key}_ci_high": hi})
    return out


def report():
    def sampled(mean, best):
        return {"sampled_mean_reward": (mean, mean - 0.01, mean + 0.01), "best_of_k_reward": (best, best - 0.01,
                                                                                             best + 0.01)}

    test = {"sft": flat(0.30, 0.28, 0.32, sampled(0.22, 0.40)), "sft_longer": flat(0.50, 0.45, 0.55, sampled(0.4, 0.6)),
            "grpo": flat(0.33, 0.31, 0.35, sampled(0.25, 0.41)),
            "grpo_minus_sft": flat(0.03, 0.01, 0.05, sampled(0.03, 0.005)),
            "sft_longer_minus_sft": flat(0.2, 0.15, 0.25, sampled(0.18, 0.2)),
            "grpo_minus_sft_longer": flat(-0.17, -0.2, -0.1), "sft_minus_constant": flat(0.15, 0.1, 0.2)}
    ood = {name: flat(value["mean_reward"] / 2, value["mean_reward"] / 2 - 0.05, value["mean_reward"] / 2 + 0.05)
           for name, value in test.items()}
    return {"study": "demo", "env": "someenv", "seeds": [5, 6, 7, 8, 9], "arms": ["sft_longer", "grpo"],
            "select": "best_val", "confidence": 0.95, "comparisons": ["grpo_minus_sft_longer"],
            "results": {"test": test, "test_ood": ood}}


def test_a_block_shows_every_arm_and_difference_with_its_interval_bold_only_where_it_excludes_zero():
    text = readme.table(report(), "demo")
    assert "| split | sft | sft_longer | grpo | sft_longer - sft | grpo - sft | grpo - sft_longer |" in text
    assert ("| test | 0.300 [0.280, 0.320] | 0.500 [0.450, 0.550] | 0.330 [0.310, 0.350] | **+0.200 [+0.150, +0.250]** "
            "| **+0.030 [+0.010, +0.050]** | **-0.170 [-0.200, -0.100]** |") in text
    # test_ood: grpo - sft = +0.015 [-0.035, +0.065] holds 0: not bold
    assert "| +0.015 [-0.035, +0.065] |" in text and "**+0.015" not in text
    assert "sft - constant" not in text  # the start against the blind baselines stays in the report
    assert "| best-of-k | 0.400 [0.390, 0.410] | 0.600 [0.590, 0.610] | 0.410 [0.400, 0.420] | " in text
    assert text.rstrip().endswith("| **+0.200 [+0.190, +0.210]** | +0.005 [-0.005, +0.015] |")
    assert "[studies/demo/report.md](studies/demo/report.md)" in text and "seeds 5, 6, 7, 8, 9" in text


def test_study_tables_rewrites_a_stale_block_and_check_finds_one(tmp_path, monkeypatch, capsys):
    (tmp_path / "studies" / "demo").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    readme.report_file(tmp_path, "demo").write_text(json.dumps(report()))
    page = tmp_path / "README.md"
    example = "```markdown\n<!-- study-table: other -->\n<!-- /study-table -->\n```\n"  # shown, not filled
    page.write_text(f"# x\n\n<!-- study-table: demo -->\nhand-typed\n<!-- /study-table -->\n\n{example}after\n")
    monkeypatch.chdir(tmp_path)
    assert tables(["--check"]) == 1 and "README.md: differs" in capsys.readouterr().out
    assert tables([]) == 0
    assert tables(["--check"]) == 0 and page.read_text().endswith(f"<!-- /study-table -->\n\n{example}after\n")
    assert "hand-typed" not in page.read_text() and "**+0.030 [+0.010, +0.050]**" in page.read_text()
    page.write_text(page.read_text().replace("+0.030", "+0.031"))  # a number edited by hand
    assert readme.stale(tmp_path) == [page]


def test_this_repositorys_study_tables_agree_with_the_committed_reports():
    assert readme.stale(REPO) == [], "run `vlmgym study tables` (the pages differ from the studies' reports)"
    quoted = {name for page in readme.pages(REPO) for name in readme.blocks(page.read_text())}
    committed = {path.parent.name for path in (REPO / "studies").glob("*/report.json")}
    assert committed <= quoted, f"studies with a report but no table in the docs: {sorted(committed - quoted)}"


def test_a_summary_block_shows_one_row_per_study_and_split_with_a_blank_where_a_study_lacks_an_arm(tmp_path):
    other = {**report(), "study": "wider", "env": "otherenv", "seeds": [1, 2, 3],
             "arms": ["sft_longer", "sft_compute", "grpo"], "comparisons": ["grpo_minus_sft_longer",
                                                                            "grpo_minus_sft_compute"]}
    other["results"] = {"test": {**report()["results"]["test"], "sft_compute": flat(0.4, 0.3, 0.5),
                                 "grpo_minus_sft_compute": flat(-0.07, -0.09, -0.01)}}
    for name, content in (("demo", report()), ("wider", other)):
        (tmp_path / "studies" / name).mkdir(parents=True)
        readme.report_file(tmp_path, name).write_text(json.dumps(content))
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("<!-- study-summary: demo wider -->\n<!-- /study-summary -->\n")
    text = readme.rendered(tmp_path, page.read_text(), page)
    assert ("| study (env, seeds) | split | sft | sft_longer | grpo | sft_compute | sft - constant | sft - sft_blind "
            "| grpo - sft | grpo - sft_longer | grpo - sft_compute |") in text
    # demo has no sft_compute arm nor sft_blind baseline: blank cells, not zeros
    assert ("| [demo](../studies/demo/report.md) (someenv, 5) | test | 0.300 | 0.500 | 0.330 |  | "
            "**+0.150 [+0.100, +0.200]** |  | **+0.030 [+0.010, +0.050]** | **-0.170 [-0.200, -0.100]** |  |") in text
    assert ("|  | test_ood | 0.150 | 0.250 | 0.165 |  | **+0.075 [+0.025, +0.125]** |  | +0.015 [-0.035, +0.065] |"
            in text)
    assert text.endswith("| **-0.070 [-0.090, -0.010]** |\n<!-- /study-summary -->\n")
    assert "[wider](../studies/wider/report.md) (otherenv, 3) | test |" in text
    assert readme.blocks(page.read_text()) == ["demo", "wider"]
    page.write_text("<!-- study-table: demo wider -->\n<!-- /study-table -->\n")
    with pytest.raises(ValueError, match="names one study"):
        readme.rendered(tmp_path, page.read_text(), page)


def test_an_eval_table_block_is_the_evaluate_stages_table_from_its_metrics_file(tmp_path):
    from vlmgym.eval.report import markdown_table

    metrics = {"sft": {"n": 10, "mean_reward": 0.3, "mean_reward_ci_low": 0.2, "mean_reward_ci_high": 0.4},
               "grpo": {"n": 10, "mean_reward": 0.35, "mean_reward_ci_low": 0.25, "mean_reward_ci_high": 0.45},
               "grpo_minus_sft": {"n": 10, "mean_reward": 0.05, "mean_reward_ci_low": -0.01,
                                  "mean_reward_ci_high": 0.11}}
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "eval.json").write_text(json.dumps(metrics))
    (tmp_path / "docs").mkdir()
    page = tmp_path / "README.md"
    page.write_text("<!-- eval-table: geospot metrics/eval.json sft grpo_minus_sft -->\ntyped\n<!-- /eval-table -->\n")
    assert readme.stale(tmp_path) == [page] and readme.blocks(page.read_text()) == []
    readme.rewrite(tmp_path)
    text = page.read_text()
    assert text == ("<!-- eval-table: geospot metrics/eval.json sft grpo_minus_sft -->\n"
                    + markdown_table("geospot", {"sft": metrics["sft"], "grpo_minus_sft": metrics["grpo_minus_sft"]})
                    + "<!-- /eval-table -->\n")
    assert "| mean reward | 0.300 [0.200, 0.400] | +0.050 [-0.010, +0.110] |" in text and "grpo |" not in text
    assert readme.stale(tmp_path) == []
    page.write_text(text.replace("+0.050", "+0.060"))  # a number edited by hand
    assert readme.stale(tmp_path) == [page]
    page.write_text("<!-- eval-table: geospot metrics/eval.json sft ppo -->\n<!-- /eval-table -->\n")
    with pytest.raises(ValueError, match=r"columns \['ppo'\]"):
        readme.stale(tmp_path)
