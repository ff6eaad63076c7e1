"""The stages of a study's dvc.yaml that train and answer (vlmgym.compare.layout); the report is vlmgym.compare.report.

Each is one MLflow run through the pipeline's stage-run machinery (vlmgym.tracking.stage_runs: its spool, so an
unreachable server never stops a stage; a killed training resumes its run), nested under the study's parent run:
one per study and settings (tag `vlmgym.role` = `study`, `vlmgym.study` = its name), whichever `dvc repro` ran
the stage. Each run folder gets its answers per split (<split>.jsonl, as the rollout stage writes them) and
`training.json` (steps, and the step validation selected).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import (
    BLIND,
    CONTROL,
    answer,
    arm_checkpoints,
    arm_config,
    available_splits,
    sampled_answers,
    train_arm,
)
from vlmgym.compare.seeds import seed_sections, start_config
from vlmgym.compare.settings import Study
from vlmgym.runtime.errors import UserError

ROLE = "study"


def group(study: Study) -> Any:
    """The study's MLflow parent run: found by the study's name and a digest of its settings and base params (a
    `dvc exp run` that changes them gets its own), holding both files' settings as params."""
    from vlmgym.params import read_yaml
    from vlmgym.tracking.pipeline_run import ROLE_TAG, Group

    base, own = read_yaml(study.base_params), study.raw()
    digest = hashlib.sha256(json.dumps([base, own], sort_keys=True, default=str).encode()).hexdigest()[:12]
    return Group(key={ROLE_TAG: ROLE, "vlmgym.study": study.name, "vlmgym.study_settings": digest},
                 name=f"study-{study.name}", params={**base, **own})


@contextlib.contextmanager
def tracked(study: Study, stage: str, item: dict[str, Any], section: Any, resume: Path | None = None) -> Iterator[Any]:
    """One MLflow stage run for `stage` (with a matrix stage's `item`, e.g. {"seed": 5, "arm": "grpo"}) under the
    study's parent, its lineage from the study's dvc.yaml."""
    from vlmgym.compare.layout import stage_paths
    from vlmgym.tracking import stage_runs

    name = stage + ("@" + "-".join(str(v) for v in item.values()) if item else "")
    tags = {"vlmgym.study": study.name, **{f"vlmgym.{key}": str(value) for key, value in item.items()}}
    with stage_runs.stage_run(name, section, params_file=study.base_params, resume_folder=resume, group=group(study),
                              paths=stage_paths(study, stage, item), extra_params=tags) as run:
        run.set_tags(tags)
        yield run


def answer_splits(model_dir: Path, folder: Path, policy: str, sections: dict[str, Any], run: Any,
                  training: dict[str, float] | None = None, blank_images: bool = False,
                  seed: int | None = None) -> None:
    """Greedy answers of `model_dir` on every held-out split into `folder`/<split>.jsonl, and training.json; with a
    `seed` and `rollout.sampled_answers` > 0 also that many sampled answers per test prompt (test.sampled.jsonl),
    which the report turns into sampled mean and best-of-k reward."""
    from vlmgym.eval.records import write_jsonl
    from vlmgym.runtime.atomic import write_text_atomically

    for split in available_splits(sections["rollout"].shards_dir):
        records = answer(model_dir, split, policy, sections, blank_images=blank_images)
        write_jsonl(folder / f"{split}.jsonl", records)
        run.log_metrics({f"{split}/mean_reward": sum(r["reward"] for r in records) / len(records)})
    if seed is not None and sections["rollout"].sampled_answers > 0:
        sampled = sampled_answers(model_dir, "test", policy, sections, seed)
        write_jsonl(folder / "test.sampled.jsonl", sampled)
        run.log_metrics({"test/sampled_mean_reward": sum(r["reward"] for r in sampled) / len(sampled)})
    if training is not None:
        write_text_atomically(folder / "training.json", json.dumps(training, indent=1, sort_keys=True) + "\n")
        run.log_dict(training, "training.json")


def _logger(run: Any) -> Any:
    return lambda step, metrics: run.log_metrics(metrics, step=step)


def start(study: Study, seed: int) -> Path:
    """Train seed `seed`'s SFT start (the sft section with that seed) and answer with it: runs/<seed>/sft/."""
    sections = study.sections()
    _check_seed(study, seed)
    config = start_config(sections, seed, study.run_folder(seed), study.checkpoints(seed), study.start_settings())
    with tracked(study, "start", {"seed": seed}, config, arm_checkpoints(CONTROL, config, sections)) as run:
        model_dir, training = train_arm(CONTROL, config, sections, _logger(run))
        answer_splits(model_dir, study.run_folder(seed) / CONTROL, CONTROL, sections, run, training, seed=seed)
    return model_dir


def arm(study: Study, seed: int, name: str) -> Path:
    """Train arm `name` from seed `seed`'s start and answer with it: runs/<seed>/<arm>/."""
    sections = study.sections()
    _check_seed(study, seed)
    if name not in study.arms:
        raise UserError(f"{study.params_file}: {name!r} is not in study.arms ({', '.join(study.arms)})")
    folder = study.run_folder(seed)
    seeded = seed_sections(sections, seed, start=str(folder / CONTROL / "model"))
    config = arm_config(name, seeded, folder, study.checkpoints(seed), study.arm_settings(name), study.select)
    with tracked(study, "arm", {"seed": seed, "arm": name}, config, arm_checkpoints(name, config, seeded)) as run:
        model_dir, training = train_arm(name, config, seeded, _logger(run), run.log_sample_table)
        answer_splits(model_dir, folder / name, name, seeded, run, training, seed=seed)
    return model_dir


def blind(study: Study, seed: int) -> None:
    """Seed `seed`'s start answering with every image blanked to grey: runs/<seed>/sft_blind/."""
    sections = study.sections()
    _check_seed(study, seed)
    folder = study.run_folder(seed)
    with tracked(study, "blind", {"seed": seed}, sections["rollout"]) as run:
        answer_splits(folder / CONTROL / "model", folder / BLIND, BLIND, sections, run, blank_images=True)


def constant(study: Study) -> None:
    """The best constant answer (chosen on val, the same for every seed) on every held-out split: runs/constant/,
    with constant.json saying which answer (or that the env has no ideal answer to propose)."""
    from vlmgym.compare.arms import constant_answers
    from vlmgym.eval.records import write_jsonl
    from vlmgym.runtime.atomic import write_text_atomically

    sections = study.sections()
    folder = study.folder / "runs" / "constant"
    with tracked(study, "constant", {}, sections["rollout"]) as run:
        chosen, answers = constant_answers(sections, available_splits(sections["rollout"].shards_dir))
        for split, records in answers.items():
            write_jsonl(folder / f"{split}.jsonl", records)
        summary = ({"answer": None, "why": f"{sections['env'].name} has no ideal answer to propose"} if chosen is None
                   else dict(zip(("answer", "mean_reward", "chosen_on", "candidates"), chosen, strict=True)))
        write_text_atomically(folder / "constant.json", json.dumps(summary, indent=1) + "\n")
        run.log_dict(summary, "constant.json")
    print(f"constant: {summary}", flush=True)


def _check_seed(study: Study, seed: int) -> None:
    if seed not in study.seeds:
        raise UserError(f"{study.params_file}: seed {seed} is not in study.seeds ({', '.join(map(str, study.seeds))})")
