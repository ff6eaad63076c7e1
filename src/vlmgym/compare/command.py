"""vlmgym compare: training algorithms from one start policy at a matched budget, compared on the held-out splits.

    vlmgym compare [--params params.yaml] [--arms sft_longer grpo ppo dpo [rloo]] [--variant NAME=KEY=VALUE[,...]]
                   [--seeds N [--first-seed F] [--only-seed S]] [--out outputs/compare]

Arms (each against `sft`, the start policy itself: `train.init_dir`, the pipeline's SFT model):
- grpo, ppo, dpo (and rloo, on request): the train section with `train.algorithm` set to the arm, everything
  else as configured
  (validation and `select` included). The budget is matched in sampled completions: every RL arm samples, scores
  and learns from train.steps x batch_prompts x group_size answers (DPO learns from the best/worst pair of each).
- sft_longer: SFT continued from the same start on the env's ideal answers for as many training sequences as an
  RL arm samples (ceil(train.steps x batch_prompts x group_size / sft.batch_size) steps of the sft section's
  settings: lr, schedule, validation): what supervised data alone buys with the same number of sequences.
- a variant (`--variant NAME=KEY=VALUE[,KEY=VALUE...]`, repeatable): the train section with those keys changed
  (TRL's names accepted; a sub-section's key dotted, optimizer.lr=3e-5), e.g. `--variant
  gspo=importance_sampling_level=sequence`: a knob on against the same seeds' `grpo` arm off, at the same budget.
  Values are read as YAML and validated as params.yaml's would be.
Beside the arms, two image-blind baselines answer the same splits (vlmgym.eval.blind): `constant`, the best constant
answer chosen on val, and `sft_blind`, the start policy with its images blanked; the report adds sft minus each.
Each arm answers every split (`test`, plus the env's out-of-distribution `test_ood` when the shard stage wrote
one) greedily as the rollout stage does; the report holds, per split, every arm's metrics with bootstrap
intervals and each arm minus sft with paired bootstrap intervals (the same samples), as <out>/compare.md, .json
and .png (not under reports/, which is the evaluate stage's DVC output as a whole), and one MLflow run (tag
vlmgym.role=compare) holding those figures, with each arm's training in a nested run. An arm whose model and
answers exist for the same settings is not trained again; a killed arm resumes from its checkpoints
(checkpoints/compare/<arm>/<config hash>/).

--seeds N (N > 1) repeats all of it for seeds 0..N-1 (`--first-seed F`: F..F+N-1; vlmgym.compare.seeds): seed s
trains its own SFT start from the base model with sft.seed = s (the pipeline's SFT model is reused when it is that
one), then every arm from it with train.seed = s, under <out>/seed<s>/ and checkpoints/compare/seed<s>/; the report
gives means over seeds with two-level bootstrap intervals (seeds, then samples) and each seed's mean reward.
`--only-seed s` trains and answers seed s alone and writes no report, so seeds can run as processes side by side; the
same command without it then reuses every seed's arms and reports.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.compare.seeds import CONTROL, HEADLINE, per_seed_table, seed_numbers, seed_plan, seed_results
from vlmgym.eval.blind import CONSTANT, blind_name
from vlmgym.params import SFTParams, TrainParams, with_values

ARMS = ("sft_longer", "grpo", "ppo", "dpo", "rloo")
DEFAULT_ARMS = ("sft_longer", "grpo", "ppo", "dpo")  # rloo on request: GRPO with another baseline
SPLITS = ("test", "test_ood")
# The image-blind baselines beside the arms (vlmgym.eval.blind): the best constant answer, chosen on val, and the
# start policy answering with its images blanked.
BLIND = blind_name(CONTROL)
BASELINES = (CONSTANT, BLIND)


def sft_longer_steps(train: TrainParams, sft: SFTParams) -> int:
    """SFT steps that train on as many sequences as an RL arm samples."""
    return math.ceil(train.steps * train.batch_prompts * train.group_size / sft.batch_size)


def parse_variants(specs: list[str], params_file: str) -> dict[str, dict[str, Any]]:
    """{name: {train key: validated value}} from `NAME=KEY=VALUE[,KEY=VALUE...]` strings (a KEY of a sub-section
    dotted: optimizer.lr=3e-5); a ParamsError or ValueError names the spec that is wrong."""
    import yaml

    from vlmgym.params import ParamsError, TrainParams, canonical_paths, load_section, nested_keys, value_at

    variants: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, _, settings = spec.partition("=")
        if not name.isidentifier() or not settings:
            raise ValueError(f"--variant {spec!r}: expected NAME=KEY=VALUE[,KEY=VALUE...] with NAME a word, "
                             "e.g. gspo=importance_sampling_level=sequence")
        if name in (*ARMS, CONTROL, *BASELINES) or name in variants:
            raise ValueError(f"--variant {spec!r}: the name {name!r} is taken (arms: {', '.join(ARMS)}; "
                             f"{CONTROL} and the baselines {', '.join(BASELINES)}; or an earlier variant)")
        raw: dict[str, Any] = {}
        for setting in settings.split(","):
            key, equals, value = setting.partition("=")
            if not equals or not key.strip():
                raise ValueError(f"--variant {spec!r}: {setting!r} is not KEY=VALUE")
            raw[key.strip()] = yaml.safe_load(value)
        keys = canonical_paths(TrainParams, raw, f"--variant {name}")
        for key in ("init_dir", "out_dir", "checkpointing.dir", "seed"):
            if key in keys:
                raise ValueError(f"--variant {spec!r}: {key} is set by compare (every arm starts from its seed's "
                                 "sft model, trains with that seed and writes under --out)")
        try:  # validated as params.yaml's train section with these keys changed
            train = load_section("train", params_file, overrides=nested_keys(keys))
        except ParamsError as err:
            raise ParamsError(f"--variant {spec!r}: {err}") from err
        variants[name] = {key: value_at(train, key) for key in keys}
    return variants


def arm_config(arm: str, sections: dict[str, Any], out: Path, checkpoints: Path = Path("checkpoints/compare"),
               variants: dict[str, dict[str, Any]] | None = None) -> Any:
    """The sft or train section an arm trains with (paths under `out`, start = train.init_dir); a variant's is the
    train section with its keys changed."""
    train, sft = sections["train"], sections["sft"]
    checkpoints = str(checkpoints / arm)
    if variants and arm in variants:
        return with_values(train, {**variants[arm], "out_dir": str(out / arm / "model"),
                                   "checkpointing.dir": checkpoints})
    if arm == "sft_longer":  # continues the SFT model, whose tower any perception warm-up has already warmed
        return replace(sft, steps=sft_longer_steps(train, sft), init_dir=train.init_dir,
                       out_dir=str(out / arm / "model"), checkpointing=replace(sft.checkpointing, dir=checkpoints),
                       shards_dir=train.shards_dir, perception=replace(sft.perception, steps=0))
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}: expected some of {ARMS}")
    return replace(train, algorithm=arm, out_dir=str(out / arm / "model"),
                   checkpointing=replace(train.checkpointing, dir=checkpoints))


def arm_stage(arm: str) -> str:
    """The stage an arm trains as: sft for sft_longer and the control (which trains only as a seed's SFT start),
    train for every RL arm."""
    return "sft" if arm in ("sft_longer", CONTROL) else "train"


def train_arm(arm: str, config: SFTParams | TrainParams, sections: dict[str, Any], log_metrics: Any) -> Path:
    """Train one arm as the sft / train stage would and save its model folder; returns it."""
    from vlmgym.rl.stage_setup import resume_dir, save_model, stage_policy, stage_trainer, warm_perception

    model, env_params = sections["model"], sections["env"]
    stage = arm_stage(arm)
    policy, params = stage_policy(stage, config, model)
    checkpoints = resume_dir(config.checkpointing.dir, config, model, env_params, init_dir=config.init_dir)
    if stage == "sft" and config.perception.steps:  # a seed's SFT start, warmed up as the sft stage warms its own
        params, _ = warm_perception(config, policy, params, env_params, checkpoints, log=log_metrics)
    trainer = stage_trainer(stage, config, policy, params, env_params, checkpoints, metrics_callback=log_metrics)
    params = trainer.run()
    return save_model(config.out_dir, policy, params, config.init_dir, config.lora.dropout)


def answer(model_dir: Path, split: str, arm: str, sections: dict[str, Any], blank_images: bool = False) -> list[dict]:
    """Greedy answers of a model folder on a split, as the rollout stage writes them (`blank_images`: every image
    grey, the text-only baseline)."""
    from vlmgym.eval.answering import greedy_answers

    return greedy_answers(model_dir, sections["rollout"], sections["model"], sections["env"], split, arm,
                          blank_images=blank_images)


def fingerprint(arm: str, config: SFTParams | TrainParams, sections: dict[str, Any]) -> str:
    """What an arm's training depends on: its training section and data (train, val, and the rl split where an RL arm
    samples one: prompt_split), the model and env settings, the start model (the model that answers for an
    untrained control), as content (every byte of the start model, the shards' recorded checksums), and vlmgym's and
    the env's own sources. The held-out splits' data is checked apart (run_arm), so that a changed split is answered
    again without training again."""
    from vlmgym.params import to_dict
    from vlmgym.rl.loop import config_fingerprint
    from vlmgym.rl.stage_setup import env_source_identity, folder_identity, prompt_split, source_identity

    start = sections["train"].init_dir if config is None else config.init_dir
    data = None
    if config is not None:
        splits = dict.fromkeys(("train", "val", prompt_split(arm_stage(arm), config.shards_dir, sections["env"])))
        data = {split: split_identity(config.shards_dir, split) for split in splits}
    return config_fingerprint({"arm": arm, "config": None if config is None else to_dict(config), "data": data,
                               "model": to_dict(sections["model"]), "env": to_dict(sections["env"]),
                               "rollout": to_dict(sections["rollout"]),
                               "start": folder_identity(start, every_byte=True), "code": source_identity(),
                               "env_code": env_source_identity(sections["env"])})


def split_identity(shards_dir: str, split: str) -> str | None:
    """A hash of a split's shard files' content (vlmgym.data.shards.split_identity): answers on a split are stale once
    its data changed."""
    from vlmgym.data.shards import split_identity as content

    return content(shards_dir, split)


def run_arm(arm: str, config: SFTParams | TrainParams, sections: dict[str, Any], folder: Path, splits: list[str],
            log_metrics: Any) -> dict[str, list]:
    """Train with `config` (None: the start train.init_dir answers) and answer every split into `folder`; reuses a
    finished arm with the same settings, and its model when only a split's data changed (that split is answered
    again). The arm `sft_blind` is the start model answering with blanked images."""
    from vlmgym.eval.records import read_jsonl, write_jsonl
    from vlmgym.runtime.atomic import write_text_atomically

    done = folder / "done.json"
    key = fingerprint(arm, config, sections)
    data = {split: split_identity(sections["rollout"].shards_dir, split) for split in splits}
    model_dir = Path(sections["train"].init_dir if config is None else config.out_dir)
    state = json.loads(done.read_text()) if done.exists() else {}
    # a model folder is written atomically (save_model): present means whole
    trained = state.get("fingerprint") == key and model_dir.is_dir()
    answered = state.get("data", {}) if trained else {}
    stale = [split for split in splits
             if answered.get(split) != data[split] or not (folder / f"{split}.jsonl").is_file()]
    if not stale:
        print(f"compare: {arm}: reusing {folder} (same settings)", flush=True)
        return {split: read_jsonl(folder / f"{split}.jsonl") for split in splits}
    if not trained and config is not None:
        model_dir = train_arm(arm, config, sections, log_metrics)
    elif trained:
        print(f"compare: {arm}: reusing {model_dir}, answering {', '.join(stale)} again (not the data its answers "
              "were made on)", flush=True)
    answers = {}
    for split in splits:
        if split in stale:
            answers[split] = answer(model_dir, split, arm, sections, blank_images=arm == BLIND)
            write_jsonl(folder / f"{split}.jsonl", answers[split])
        else:
            answers[split] = read_jsonl(folder / f"{split}.jsonl")
    write_text_atomically(done, json.dumps({"fingerprint": key, "data": data}) + "\n")
    return answers


def constant_answers(sections: dict[str, Any], splits: list[str], folder: Path) -> dict[str, list] | None:
    """The constant baseline's records on every split (one answer, chosen on val: the same for every seed); None
    when the env has no ideal answer to propose."""
    from vlmgym.eval import answering, blind
    from vlmgym.eval.records import read_jsonl, write_jsonl
    from vlmgym.models.qwen3_vl.processor import Processor
    from vlmgym.runtime.atomic import write_text_atomically

    rollout, env_params, done = sections["rollout"], sections["env"], folder / "done.json"
    chosen_on = blind.constant_split(rollout.shards_dir)
    key = {"fingerprint": fingerprint(CONSTANT, None, sections),
           "data": {split: split_identity(rollout.shards_dir, split) for split in [chosen_on, *splits]}}
    if done.exists() and json.loads(done.read_text()) == key:
        return {split: read_jsonl(folder / f"{split}.jsonl") for split in splits}
    tokenizer = Processor.from_pretrained(sections["sft"].init_dir).tokenizer  # every start shares the base tokenizer
    chosen = answering.choose_constant(rollout, env_params, rollout.shards_dir, tokenizer)
    if chosen is None:
        print(f"compare: {env_params.name} has no ideal answer to propose: no constant baseline", flush=True)
        return None
    # the held-out splits as the arms answer them (rollout.limit)
    answers = {split: blind.constant_records(answering.open_env(env_params, rollout, rollout.shards_dir, split,
                                                                tokenizer, rollout.limit), chosen[0])
               for split in splits}
    for split, records in answers.items():
        write_jsonl(folder / f"{split}.jsonl", records)
    write_text_atomically(done, json.dumps(key) + "\n")
    print(f"compare: constant answer {chosen[0]!r} (best of {chosen[3]} on {chosen[2]}: mean reward "
          f"{chosen[1]:.3f})", flush=True)
    return answers


def available_splits(shards_dir: str) -> list[str]:
    """The held-out splits the shard stage wrote: test, and the env's OOD split when it has one."""
    found = [split for split in SPLITS if (Path(shards_dir) / split).is_dir()]
    if "test" not in found:
        raise FileNotFoundError(f"{shards_dir}/test: no test split; run the pipeline (dvc repro) first")
    return found


def write_report(report: Path, env_name: str, results: dict[str, dict], arms: list[str], sections: dict[str, Any],
                 confidence: float, seeds: list[int] | None = None,
                 variants: dict[str, dict[str, Any]] | None = None) -> dict[str, Path]:
    """reports/compare.{md,json,png}: per split the summary table (every arm, each minus sft) and a plot."""
    from vlmgym.envs import env_class
    from vlmgym.eval.report import markdown_table
    from vlmgym.runtime.atomic import write_text_atomically

    env = env_class(env_name)
    train, sft = sections["train"], sections["sft"]
    budget = train.steps * train.batch_prompts * train.group_size
    n_seeds = len(seeds) if seeds else 1
    if seeds:
        start = (f"{n_seeds} seeds ({', '.join(map(str, seeds))}): seed s trains its own SFT start (the `sft` column, "
                 f"from `{sft.init_dir}` with sft.seed = s) and every arm from it with train.seed = s. Values are "
                 f"means over seeds; intervals are a two-level bootstrap (seeds with replacement, then test samples "
                 f"within each), so they include the run-to-run variance; differences pair each seed's arm with "
                 f"that seed's sft on the same samples.")
    else:
        start = (f"1 seed: intervals over test samples only (one training run; run-to-run variance is not in them). "
                 f"Every arm starts from `{train.init_dir}` (the `sft` column).")
    lines = [f"# Algorithm comparison ({env.name}, {n_seeds} seed{'s' if n_seeds > 1 else ''})", "",
             f"{start} RL arms: {train.steps} steps x "
             f"{train.batch_prompts} prompts x {train.group_size} answers = {budget} sampled completions each; "
             f"sft_longer: {sft_longer_steps(train, sft)} more SFT steps x {sft.batch_size} = the same number of "
             f"training sequences on ideal answers. Greedy answers; `arm_minus_sft` columns are paired differences.",
             ""]
    if variants:
        lines += ["Variants: " + "; ".join(f"`{name}` is {train.algorithm} with " + ", ".join(
            f"{key} = {value}" for key, value in values.items()) for name, values in variants.items()) + "."
                  + (f" `<variant>_minus_{train.algorithm}` pairs each variant with {train.algorithm} on the same "
                     "samples (and seeds): what the change does." if train.algorithm in arms else ""), ""]
    if BLIND in results.get("test", {}):
        lines += ["Image-blind baselines: `constant` is the best constant answer (one answer for every sample, chosen "
                  "on val), `sft_blind` each seed's start policy answering with its images blanked to grey; "
                  "`sft_minus_constant` and `sft_minus_sft_blind` above 0 show that the start policy uses the "
                  "image.", ""]
    lines += ["## Mean reward, every split", "", headline_table(results), ""]
    for split, split_results in results.items():
        shift = env.ood_description(sections.get("data"))
        note = f" ({shift})" if split != "test" and shift else ""
        lines += [f"## {split}{note}", "", markdown_table(env, split_results, confidence)]
        if seeds:

            lines += [f"### {split}: mean reward on each seed", "", per_seed_table(split_results, seeds)]
    if len(results) > 1:
        from vlmgym.eval.outputs import side_by_side

        (ood, ood_results), differences = list(results.items())[1], {k for k in results["test"] if "_minus_" in k}
        lines += [f"## Each arm's gain over {CONTROL}, in distribution and out of it", "",
                  "Does what an arm gained on test carry over to the shifted split?", "",
                  markdown_table(env, side_by_side({k: v for k, v in results["test"].items() if k in differences},
                                                   ood_results, "test", ood), confidence)]
    files = {"md": report.with_suffix(".md"), "json": report.with_suffix(".json"), "png": report.with_suffix(".png")}
    write_text_atomically(files["md"], "\n".join(lines))
    write_text_atomically(files["json"], json.dumps(results, indent=1, sort_keys=True) + "\n")
    plot_comparison(files["png"], results, arms, confidence, n_seeds)
    return files


def headline_table(results: dict[str, dict]) -> str:
    """Markdown: one row per policy or difference, its mean reward [interval] on each split as a column."""
    from vlmgym.eval.report import format_value

    splits = list(results)
    lines = ["| policy | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for name in results[splits[0]]:
        cells = []
        for split in splits:
            flat = results[split].get(name, {})
            signed = "_minus_" in name
            cells.append(" ".join([format_value(flat.get(HEADLINE), "reward", signed),
                                   f"[{format_value(flat.get(f'{HEADLINE}_ci_low'), 'reward', signed)},",
                                   f"{format_value(flat.get(f'{HEADLINE}_ci_high'), 'reward', signed)}]"]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_comparison(path: Path, results: dict[str, dict], arms: list[str], confidence: float, n_seeds: int = 1) -> None:
    """Per split: each arm's mean reward with its interval, and each arm minus sft with its paired interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlmgym.stats.plots import POLICY_COLOURS, save_figure

    figure, axes = plt.subplots(len(results), 2, figsize=(10, 3.2 * len(results)), squeeze=False)
    try:
        for row, (split, split_results) in enumerate(results.items()):
            names = [CONTROL, *arms]
            for column, (keys, title) in enumerate((
                    (names, f"{split}: mean reward"), ([f"{a}_minus_{CONTROL}" for a in arms],
                                                       f"{split}: arm - {CONTROL} (paired)"))):
                axis = axes[row][column]
                values = [split_results[k][HEADLINE] for k in keys]
                low = [split_results[k][HEADLINE] - split_results[k][f"{HEADLINE}_ci_low"] for k in keys]
                high = [split_results[k][f"{HEADLINE}_ci_high"] - split_results[k][HEADLINE] for k in keys]
                # one colour per arm in both panels
                colours = [POLICY_COLOURS[names.index(k.replace(f"_minus_{CONTROL}", "")) % len(POLICY_COLOURS)]
                           for k in keys]
                axis.bar(range(len(keys)), values, yerr=[low, high], color=colours, capsize=4)
                axis.set_xticks(range(len(keys)), [k.replace(f"_minus_{CONTROL}", "") for k in keys])
                axis.axhline(0, color="grey", linewidth=0.8)
                seeds = f"{n_seeds} seed{'s' if n_seeds > 1 else ''}"
                axis.set_title(title + f" [{seeds}, {100 * confidence:.0f}% interval]", fontsize="medium")
        figure.tight_layout()
        save_figure(figure, path)
    finally:
        plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Train every arm, answer the held-out splits, write the comparison and log it to MLflow."""
    parser = argparse.ArgumentParser(prog="vlmgym compare", description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (the pipeline's)")
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS,
                        help=f"arms besides sft (default: {' '.join(DEFAULT_ARMS)})")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,...]",
                        help="an arm NAME: the train section with KEY=VALUE changed (repeatable), e.g. "
                             "gspo=importance_sampling_level=sequence")
    parser.add_argument("--seeds", type=int, default=1,
                        help="training seeds 0..N-1, each with its own SFT start (default 1: the configured seeds "
                             "and the pipeline's SFT model, intervals over test samples only)")
    parser.add_argument("--first-seed", type=int, default=0, metavar="F",
                        help="with --seeds N: seeds F..F+N-1 instead of 0..N-1, e.g. a replication on seeds that "
                             "no earlier comparison used")
    parser.add_argument("--only-seed", type=int, default=None, metavar="S",
                        help="train and answer seed S of --seeds N only and write no report: run one process per "
                             "seed side by side, then the same command without --only-seed reuses them and reports")
    parser.add_argument("--out", default="outputs/compare", help="models and answers, one folder per arm")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.first_seed < 0 or (args.first_seed and args.seeds < 2):
        parser.error(f"--first-seed {args.first_seed}: needs --seeds N > 1 and a seed >= 0")
    last = args.first_seed + args.seeds - 1
    if args.only_seed is not None and not (args.seeds > 1 and args.first_seed <= args.only_seed <= last):
        parser.error(f"--only-seed {args.only_seed}: needs --seeds N > 1 and a seed in {args.first_seed}..{last}")
    import mlflow

    from vlmgym.eval.outputs import mlflow_metrics
    from vlmgym.params import ParamsError, load_section
    from vlmgym.tracking import stage_runs as tracking

    try:
        variants = parse_variants(args.variant, args.params)
    except (ParamsError, ValueError) as err:
        parser.error(str(err))
    sections = {name: load_section(name, args.params)
                for name in ("train", "sft", "model", "env", "rollout", "eval", "tracking", "data")}
    if "ppo" in args.arms and getattr(sections["env"].settings(), "tools", ()):
        parser.error(f"--arms ppo: env {sections['env'].name!r} runs episodes with tools, which PPO does not train "
                     "(grpo, rloo and dpo do): leave ppo out of --arms")
    # One seed keeps the configured seeds, the pipeline's SFT start and the folders of a run without --seeds.
    seeds = seed_numbers(args.seeds, args.first_seed)
    trained_seeds = seeds if args.only_seed is None else [args.only_seed]
    # the pipeline's SFT model is the start of the configured seed; the other seeds train their own
    if (not seeds or sections["sft"].seed in trained_seeds) and not Path(sections["train"].init_dir).is_dir():
        print(f"compare: {sections['train'].init_dir}: no start model; run the pipeline (dvc repro) first",
              file=sys.stderr)
        return 1
    splits = available_splits(sections["rollout"].shards_dir)
    arms = list(dict.fromkeys(args.arms)) + list(variants)
    out = Path(args.out)
    tracking.open_experiment(tracking.tracking_uri(sections["tracking"].tracking_uri),
                             sections["tracking"].experiment)
    answers: list[dict[str, dict[str, list]]] = []
    env_name = sections["env"].name
    run_name = f"compare-{env_name}" + (f"-{len(seeds)}seeds" if seeds else "")
    run_name += "" if args.only_seed is None else f"-seed{args.only_seed}"
    with mlflow.start_run(run_name=run_name, tags={"vlmgym.role": "compare", "env.name": env_name}):
        train = sections["train"]
        mlflow.log_params({"arms": ",".join(arms), "splits": ",".join(splits), "start": train.init_dir,
                           "seeds": args.seeds, "first_seed": args.first_seed, "train.steps": train.steps,
                           "train.batch_prompts": train.batch_prompts, "train.group_size": train.group_size,
                           "sft_longer.steps": sft_longer_steps(train, sections["sft"]),
                           **{f"variant.{name}": ",".join(f"{k}={v}" for k, v in values.items())
                              for name, values in variants.items()}})
        constant = constant_answers(sections, splits, out / CONSTANT)
        for seed in trained_seeds or [None]:
            folder, checkpoints = out, Path("checkpoints/compare")
            seed_sections, start_config = sections, None
            if seed is not None:
                folder, checkpoints = out / f"seed{seed}", checkpoints / f"seed{seed}"
                seed_sections, start_config = seed_plan(sections, seed, folder, checkpoints)
            answers.append({})
            for arm in [CONTROL, *arms]:
                config = (start_config if arm == CONTROL
                          else arm_config(arm, seed_sections, folder, checkpoints, variants))
                tags = {"vlmgym.role": "compare-arm", "vlmgym.arm": arm,
                        "vlmgym.seed": str(seed_sections["train"].seed)}
                with mlflow.start_run(run_name=arm if seed is None else f"seed{seed}/{arm}", nested=True, tags=tags):
                    answers[-1][arm] = run_arm(arm, config, seed_sections, folder / arm, splits,
                                               lambda step, metrics: mlflow.log_metrics(metrics, step=step))
            answers[-1][BLIND] = run_arm(BLIND, None, seed_sections, folder / BLIND, splits, None)
            if constant is not None:
                answers[-1][CONSTANT] = constant
        if args.only_seed is not None:
            again = f"--seeds {args.seeds}" + (f" --first-seed {args.first_seed}" if args.first_seed else "")
            print(f"compare: seed {args.only_seed} done; `vlmgym compare {again}` reports every seed")
            return 0
        baselines = [b for b in BASELINES if b in answers[0]]
        # each variant against the arm it varies (train.algorithm), when that arm ran too: what the knob changes
        base = sections["train"].algorithm
        knob_pairs = [(name, base) for name in variants if base in arms]
        evaluation = sections["eval"]
        results = {split: seed_results(env_name, [{arm: a[arm][split] for arm in a} for a in answers], arms,
                                       n_resamples=evaluation.n_resamples, seed=evaluation.seed,
                                       confidence=evaluation.confidence, baselines=baselines,
                                       comparisons=knob_pairs)
                   for split in splits}
        files = write_report(out / "compare", env_name, results, arms, sections, evaluation.confidence, seeds,
                             variants)
        for split, split_results in results.items():
            mlflow.log_metrics({f"{split}/{k}": v for k, v in mlflow_metrics(split_results).items()
                                if np.isfinite(v)})
        for path in files.values():
            mlflow.log_artifact(str(path))
    print(files["md"].read_text())
    return 0
