"""The stages of a forgetting study's dvc.yaml that train and answer (the report is ...forgetting.report):

    generalist@S   -> runs/S/generalist/: SFT of the base model on every old skill at once (study.env), seed S;
                   answers each old skill's held-out splits (and with blank images), the new skill's test split
                   greedily and rollout.sampled_answers times sampled (its best-of-k), and its KL to itself (0)
    single@S       -> runs/S/single/: each old skill's single-task SFT at the generalist's settings, and its answers
    point@S-P      -> runs/S/P/: sweep point P (SFT or RL on the new skill) from seed S's generalist; the same
                   answers as the generalist's, and its KL to it
    constant       -> runs/constant/: each skill's best constant answer, chosen on val

Each is one MLflow run nested under the study's parent run (vlmgym.compare.stages.tracked).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from vlmgym.compare.arms import CONTROL, answer, arm_checkpoints, available_splits, sampled_answers, train_arm
from vlmgym.compare.forgetting import kl
from vlmgym.compare.forgetting.settings import BLIND, GENERALIST, NEW, OLD, SINGLE, ForgettingStudy
from vlmgym.compare.seeds import seeded
from vlmgym.compare.stages import tracked
from vlmgym.envs import registry
from vlmgym.params import with_values
from vlmgym.runtime.errors import UserError

VAL_SUFFIX = "val/reward_greedy"  # the validation figures kept in training.json: pooled, and each part's


def _write(path: Path, obj: Any) -> None:
    from vlmgym.runtime.atomic import write_text_atomically

    write_text_atomically(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def _recorder(run: Any, history: dict[str, list]) -> Any:
    """The trainer's metrics callback: logs to MLflow and keeps every greedy val reward (pooled, and each part's
    `env/<name>/val/reward_greedy`), so the report can show whether each skill's val had levelled off."""
    def log(step: int, metrics: dict[str, float]) -> None:
        run.log_metrics(metrics, step=step)
        for name, value in metrics.items():
            if name.endswith(VAL_SUFFIX):
                history.setdefault(name, []).append([int(step), float(value)])
    return log


def answer_greedy(model_dir: Path, folder: Path, policy: str, sections: dict[str, Any], run: Any,
                  blank_images: bool = False) -> None:
    """Greedy answers on every held-out split of `sections`' env into `folder`/<split>.jsonl."""
    from vlmgym.eval.records import write_jsonl

    for split in available_splits(sections["rollout"].shards_dir):
        records = answer(model_dir, split, policy, sections, blank_images=blank_images)
        write_jsonl(folder / f"{split}.jsonl", records)
        run.log_metrics({f"{folder.name}/{split}/mean_reward": sum(r["reward"] for r in records) / len(records)})


def answer_skills(study: ForgettingStudy, sections: dict[str, Any], model_dir: Path, folder: Path, policy: str,
                  seed: int, run: Any, generalist_dir: Path) -> None:
    """A run's answers: every old skill's held-out splits (old/<part>/), the new skill's test split greedy and
    sampled (new/), and its KL to the generalist on the new skill's prompts (kl.json)."""
    from vlmgym.eval.records import write_jsonl

    for part in study.old_skills(sections):
        answer_greedy(model_dir, folder / OLD / part, policy, study.part_sections(sections, part), run)
    new = study.new_sections(sections)
    answer_greedy(model_dir, folder / NEW, policy, new, run)
    k = new["rollout"].sampled_answers
    if k < 1:
        raise UserError(f"{study.base_params}: rollout.sampled_answers is {k}: a forgetting study samples answers "
                        "on the new skill for its best-of-k and its KL estimate; set it to 1 or more")
    write_jsonl(folder / NEW / "test.sampled.jsonl", sampled_answers(model_dir, "test", policy, new, seed))
    divergence = kl.estimate(model_dir, generalist_dir, new, k, seed, policy)
    _write(folder / "kl.json", divergence)
    run.log_metrics({f"kl/{d}": divergence[d] for d in kl.DIRECTIONS})


def _generalist_config(study: ForgettingStudy, sections: dict[str, Any], seed: int, out: Path, resume: str) -> Any:
    """The sft section with study.generalist and seed `seed`, its model under `out`, its checkpoints under
    `resume` in the seed's checkpoint folder."""
    sft = seeded(with_values(sections["sft"], study.generalist_settings()), seed)
    return replace(sft, out_dir=str(out / "model"),
                   checkpointing=replace(sft.checkpointing, dir=str(study.checkpoints(seed) / resume)))


def generalist(study: ForgettingStudy, seed: int) -> None:
    """Seed `seed`'s generalist: the sft section with study.generalist, trained on every old skill at once."""
    sections = study.sections()
    _check_seed(study, seed)
    folder = study.run_folder(seed) / GENERALIST
    config = _generalist_config(study, sections, seed, folder, GENERALIST)
    with tracked(study, GENERALIST, {"seed": seed}, config, arm_checkpoints(CONTROL, config, sections)) as run:
        history: dict[str, list] = {}
        model_dir, training = train_arm(CONTROL, config, sections, _recorder(run, history))
        _write(folder / "training.json", {**training, "val": history})
        answer_skills(study, sections, model_dir, folder, GENERALIST, seed, run, model_dir)
        for part in study.old_skills(sections):
            answer_greedy(model_dir, folder / BLIND / part, f"{GENERALIST}_blind", study.part_sections(sections, part),
                          run, blank_images=True)


def single(study: ForgettingStudy, seed: int) -> None:
    """Seed `seed`'s single-task SFT of each old skill, at the generalist's settings: runs/<seed>/single/<part>/."""
    sections = study.sections()
    _check_seed(study, seed)
    with tracked(study, SINGLE, {"seed": seed}, sections["sft"]) as run:
        for part in study.old_skills(sections):
            own = study.part_sections(sections, part)
            folder = study.run_folder(seed) / SINGLE / part
            config = _generalist_config(study, own, seed, folder, f"{SINGLE}/{part}")
            if not registry.env_class(own["env"].name).has_perception_labels():  # warmed by another part's labels
                config = replace(config, perception=replace(config.perception, steps=0))
            history: dict[str, list] = {}
            model_dir, training = train_arm(CONTROL, config, own, _recorder(run, history))
            _write(folder / "training.json", {**training, "val": history})
            answer_greedy(model_dir, folder, f"{SINGLE}_{part}", own, run)


def point_config(study: ForgettingStudy, new: dict[str, Any], seed: int, point: str, start: Path, out: Path) -> Any:
    """The section point `point` trains with: its method's (sft, or train with that algorithm) seeded, from the
    generalist `start`, on the new skill's shards, with the point's settings and study.select."""
    method = study.method(point)
    if method == CONTROL:  # a warm-up would retrain the generalist's tower on the new skill's labels
        base = replace(new["sft"], perception=replace(new["sft"].perception, steps=0))
    else:
        base = replace(new["train"], algorithm=method)
    base = replace(seeded(base, seed), init_dir=str(start), out_dir=str(out / "model"))
    return with_values(base, {**study.settings_of(point), "validation.select": study.select,
                              "checkpointing.dir": str(study.checkpoints(seed) / point)})


def point(study: ForgettingStudy, seed: int, name: str) -> None:
    """Sweep point `name` from seed `seed`'s generalist, and its answers: runs/<seed>/<name>/."""
    sections = study.sections()
    _check_seed(study, seed)
    start = study.run_folder(seed) / GENERALIST / "model"
    if not start.is_dir():
        raise UserError(f"{start}: seed {seed}'s generalist is not trained; run its stage first (dvc repro "
                        f"{study.folder}/dvc.yaml)")
    folder = study.run_folder(seed) / name
    new = study.new_sections(sections)
    config = point_config(study, new, seed, name, start, folder)
    method = study.method(name)
    with tracked(study, "point", {"seed": seed, "point": name}, config, arm_checkpoints(method, config, new)) as run:
        history: dict[str, list] = {}
        model_dir, training = train_arm(method, config, new, _recorder(run, history))
        _write(folder / "training.json", {**training, "method": method, "val": history})
        answer_skills(study, sections, model_dir, folder, name, seed, run, start)


def constant(study: ForgettingStudy) -> None:
    """Each skill's best constant answer (chosen on its val split): runs/constant/<part>/ and runs/constant/new/."""
    from vlmgym.compare.arms import constant_answers
    from vlmgym.eval.records import write_jsonl

    sections = study.sections()
    skills = {**{part: study.part_sections(sections, part) for part in study.old_skills(sections)},
              NEW: study.new_sections(sections)}
    with tracked(study, "constant", {}, sections["rollout"]) as run:
        for where, own in skills.items():
            folder = study.folder / "runs" / "constant" / where
            chosen, answers = constant_answers(own, available_splits(own["rollout"].shards_dir))
            for split, records in answers.items():
                write_jsonl(folder / f"{split}.jsonl", records)
            summary = ({"answer": None, "why": f"{own['env'].name} has no ideal answer to propose"}
                       if chosen is None else dict(zip(("answer", "mean_reward", "chosen_on", "candidates"), chosen,
                                                       strict=True)))
            _write(folder / "constant.json", summary)
            run.log_dict(summary, f"{where}/constant.json")


def _check_seed(study: ForgettingStudy, seed: int) -> None:
    if seed not in study.seeds:
        raise UserError(f"{study.params_file}: seed {seed} is not in study.seeds ({', '.join(map(str, study.seeds))})")
