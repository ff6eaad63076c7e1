"""The report stage of a study: every run's answers -> studies/<name>/report.md, report.json and report.png.

Per split (test, and test_ood where the shards hold it): each arm's and the start's metrics as means over seeds,
`<arm> - sft` for every arm and `<arm> - sft_longer` for every RL arm and variant (when sft_longer is an arm), each
variant against its algorithm's arm, and sft against the image-blind baselines, all paired per seed on the same
samples (vlmgym.compare.seeds.seed_results). The interval is the t-interval over the seeds' values, the two-level
bootstrap beside it; every seed's mean reward is listed, none left out. The figures also go onto the study's
MLflow parent run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import BLIND, CONTROL, SPLITS, sft_longer_steps
from vlmgym.compare.settings import Study, comparisons


def with_sampled(env: Any, folder: Path, split: str, records: list[dict]) -> list[dict]:
    """A run's greedy records of `split`, each with its prompt's sampled answers summarised (vlmgym.eval.sampled)
    where the run sampled them (<split>.sampled.jsonl)."""
    from vlmgym.eval.records import read_jsonl
    from vlmgym.eval.sampled import attach_sampled

    sampled = folder / f"{split}.sampled.jsonl"
    return attach_sampled(env, records, read_jsonl(sampled), str(sampled)) if sampled.is_file() else records


def runs(study: Study, env: Any) -> tuple[list[str], dict[str, list[dict[str, list]]], dict | None]:
    """(the splits answered, {split: one {policy: records} per seed}, the constant's constant.json)."""
    from vlmgym.eval.blind import CONSTANT
    from vlmgym.eval.records import read_jsonl

    first = study.run_folder(study.seeds[0]) / CONTROL
    splits = [split for split in SPLITS if (first / f"{split}.jsonl").is_file()]
    if not splits:
        raise FileNotFoundError(f"{first}: no answers; run the study's stages first (dvc repro "
                                f"{study.folder}/dvc.yaml)")
    constant = json.loads((study.folder / "runs" / CONSTANT / "constant.json").read_text())
    per_split: dict[str, list[dict[str, list]]] = {}
    for split in splits:
        per_split[split] = []
        for seed in study.seeds:
            folder = study.run_folder(seed)
            records = {name: with_sampled(env, folder / name, split, read_jsonl(folder / name / f"{split}.jsonl"))
                       for name in (CONTROL, *study.arms, BLIND)}
            if constant["answer"] is not None:
                records[CONSTANT] = read_jsonl(study.folder / "runs" / CONSTANT / f"{split}.jsonl")
            per_split[split].append(records)
    return splits, per_split, constant


def introduction(study: Study, sections: dict[str, Any], constant: dict | None, compute_steps: int = 0) -> list[str]:
    """The report's opening: what was compared, on which seeds, at which budget (`compute_steps`: sft_compute's
    steps, 0 when it is no arm), by which rule and interval."""
    train, sft, evaluation = sections["train"], sections["sft"], sections["eval"]
    n, level = len(study.seeds), f"{100 * evaluation.confidence:.0f}%"
    budget = train.steps * train.batch_prompts * train.group_size
    longer = sft_longer_steps(train, sft)
    rule = ("the best greedy val reward, the start (step 0) a candidate" if study.select == "best_val"
            else "the last step's")
    lines = [f"# Study {study.name}: {', '.join(study.arms)} against {CONTROL} ({study.env}, {n} seed"
             f"{'s' if n > 1 else ''})", "",
             f"Seeds {', '.join(map(str, study.seeds))}: every seed the study names, none left out. Each seed trains "
             f"its own SFT start (`{CONTROL}`: the sft section of `{study.base_params}` with that seed, from "
             f"`{sft.init_dir}`) and every arm from it with that seed. The seeds vary the SFT start, data order and "
             "sampling; the base model's initialisation, the dataset and the test set are shared, so the intervals "
             "are conditional on those.", "",
             f"Budget: every RL arm samples {train.steps} steps x {train.batch_prompts} prompts x {train.group_size} "
             f"answers = {budget} completions; sft_longer trains {longer} more SFT steps x {sft.batch_size} = "
             f"{longer * sft.batch_size} sequences on ideal answers (the same number of sequences)"
             + (f"; sft_compute {compute_steps} more SFT steps, as many training FLOPs as the {train.steps} steps of "
                "the train section (sampling, reference and learner passes by the 2N / 6N rule per token position, "
                "vlmgym.compare.arms.rl_step_flops)" if compute_steps else "")
             + f". Every arm ends on the params its validation selects by one rule, `validation.select: "
             f"{study.select}` ({rule}).", ""]
    if study.start:
        lines += [f"The start's settings over the sft section: {json.dumps(dict(study.start))} (the SFT controls "
                  "continue it with the sft section's own).", ""]
    variants = {arm: settings for arm, settings in study.settings.items() if settings}
    if variants:
        lines += ["Arm settings over the base params: " + "; ".join(
            f"`{arm}`: {json.dumps(settings)}" for arm, settings in variants.items()) + ".", ""]
    lines += [f"Settings: `{study.params_file}` (committed before the study ran, git history shows them first).", ""]
    if n > 1:
        lines += [f"Intervals: {level} t-interval over the seeds' own values (a difference: each seed's arm minus "
                  "that seed's control on the same samples), mean ± t(n-1) · sd / √n. Beside it the two-level "
                  "percentile bootstrap (seeds, then samples), which is too narrow with few seeds (a nominal 95% "
                  "covers about 77% at 3 seeds). **Bold**: the t-interval excludes 0.", ""]
    else:
        lines += ["One seed: its intervals are over test samples only and leave out run-to-run variance; no "
                  "difference is bold.", ""]
    what = (f"`constant` ({constant['answer']!r} for every sample, chosen on {constant['chosen_on']})"
            if constant and constant["answer"] is not None else "(no constant answer: the env proposes none)")
    lines += [f"Image-blind baselines: {what} and `{BLIND}` (each seed's start with its images blanked); `{CONTROL}"
              " - <baseline>` above 0 shows that the start uses the image.", ""]
    return lines


def write(study: Study, sections: dict[str, Any]) -> tuple[dict[str, Path], dict[str, dict]]:
    """Compute the study's results and write report.md, .json and .png into its folder; returns their paths and
    the results ({split: {policy or difference: flat figures}})."""
    from vlmgym.compare import tables
    from vlmgym.compare.seeds import per_seed_table, seed_results
    from vlmgym.envs import env_class
    from vlmgym.eval.blind import CONSTANT
    from vlmgym.runtime.atomic import write_text_atomically

    evaluation, env = sections["eval"], env_class(sections["env"].name)
    splits, per_split, constant = runs(study, env)
    baselines = [b for b in (CONSTANT, BLIND) if b in per_split[splits[0]][0]]
    pairs = comparisons(study, sections)
    results = {split: seed_results(env, per_split[split], study.arms, n_resamples=evaluation.n_resamples,
                                   seed=evaluation.seed, confidence=evaluation.confidence, baselines=baselines,
                                   comparisons=pairs) for split in splits}
    training = {name: {seed: json.loads((study.run_folder(seed) / name / "training.json").read_text())
                       for seed in study.seeds} for name in (CONTROL, *study.arms)}
    compute_steps = int(training["sft_compute"][study.seeds[0]]["steps"]) if "sft_compute" in training else 0
    lines = introduction(study, sections, constant, compute_steps)
    lines += ["## Differences in mean reward", "", tables.differences_table(results, evaluation.confidence), ""]
    for split in splits:
        shift = env.ood_description(sections["data"]) if split != "test" else ""
        lines += [f"## {split}" + (f" ({shift})" if shift else ""), "",
                  tables.metrics_table(env, results[split], evaluation.confidence, len(study.seeds)), "",
                  f"### {split}: mean reward on each seed", "", per_seed_table(results[split], study.seeds), ""]
    lines += [f"## Where each run ended (validation.select: {study.select})", "",
              tables.endings_table(training, study.seeds)]
    files = {kind: study.folder / f"report.{kind}" for kind in ("md", "json", "png")}
    write_text_atomically(files["md"], "\n".join(lines))
    summary = {"study": study.name, "env": study.env, "seeds": list(study.seeds), "arms": list(study.arms),
               "select": study.select, "confidence": evaluation.confidence,
               "interval": "t over seeds" if len(study.seeds) > 1 else "bootstrap over test samples",
               "comparisons": [f"{a}_minus_{b}" for a, b in pairs], "training": training, "results": results}
    write_text_atomically(files["json"], json.dumps(summary, indent=1, sort_keys=True) + "\n")
    tables.plot(files["png"], results, [CONTROL, *study.arms, *baselines], evaluation.confidence, len(study.seeds))
    return files, results


def report(study: Study) -> dict[str, Path]:
    """The report stage: write the report as one MLflow run under the study's parent, which gets its figures."""
    from vlmgym.compare.stages import tracked
    from vlmgym.eval.outputs import mlflow_metrics

    sections = study.sections()
    with tracked(study, "report", {}, sections["eval"]) as run:
        files, results = write(study, sections)
        figures = {f"{split}/{key}": value for split, split_results in results.items()
                   for key, value in mlflow_metrics(split_results).items()}
        run.log_metrics(figures)
        run.log_pipeline_results(figures)
        for path in files.values():
            run.log_artifact(path)
    print(f"report: {files['md']}, {files['json'].name}, {files['png'].name}", flush=True)
    return files
