"""The exported model in the MLflow model registry: one registered model per env, one version per export.

The export stage logs the transformers folder as a pyfunc model (vlmgym.tracking.pyfunc_model, models-from-code: no
pickle) in its run and registers it as `vlmgym-<env>`. Each version carries lineage tags: the DVC hash of the
folder (as dvc.lock records it), the git commit, the pipeline, the DVC experiment and the run that logged it.
The logged model has a signature and an input example (vlmgym.tracking.pyfunc_model.signature / input_example).

The evaluate stage then finds the version it evaluated (the one whose `dvc.hash` is the evaluated folder's),
records its headline figure on it as the tag `vlmgym.eval.mean_reward` and moves the alias `champion` to it when it
earns it (promote_if_better: no champion yet, or a higher figure than the champion's).

Both go through the stage run's spool (vlmgym.tracking.spool) as journal entries, `register` and `promote`, so a
tracking server that is down when the export or evaluate stage runs delays them, never loses them: the next stage
or `vlmgym tracking sync` sends them (send_entry). Sending a registration again is safe: a version the run already
registered is found, not made twice, and the model a broken upload left PENDING is marked FAILED.

    model = mlflow.pyfunc.load_model("models:/vlmgym-<env>@champion")   # or /latest, or /<version>
    model.predict([{"image": open("photo.jpg", "rb").read(), "prompt": "Where was this photo taken? ..."}])
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# What loading the model needs beside vlmgym's own source (logged with it as code).
REQUIREMENTS = ("mlflow", "transformers", "torch", "pillow", "numpy", "safetensors", "tokenizers", "jinja2")
CHAMPION = "champion"  # the registry alias of each env's best evaluated version
# The figure versions are compared on: the exported policy's mean reward over the test split's greedy answers (the
# evaluate run logs it as `<policy>/mean_reward`; every env has it, higher is better).
HEADLINE = "mean_reward"
EVAL_TAG_PREFIX = "vlmgym.eval."  # a version's evaluation: vlmgym.eval.mean_reward, vlmgym.eval.run_id


def registered_name(env_name: str) -> str:
    """`vlmgym-<env>`, with characters a registry name may not hold (an env given as module:Class) as '-'."""
    return "vlmgym-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", env_name).strip("-")


def pinned_requirements() -> list[str]:
    """REQUIREMENTS at the versions installed here (so the logged model does not make MLflow infer them, which
    would load the model in a subprocess)."""
    out = []
    for name in REQUIREMENTS:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def log_and_register(hf_dir: str | Path, env_name: str, *, max_new_tokens: int, client: Any,
                     lineage: Mapping[str, str], run_id: str | None = None) -> Any:
    """Log `hf_dir` as run `run_id`'s pyfunc model `model` (default: the active run's) and register it under
    registered_name(env_name), tagged with `lineage` as it is created; the new ModelVersion."""
    import mlflow
    from mlflow.models import Model

    import vlmgym
    from vlmgym.tracking import pyfunc_model as mlflow_model  # the model's code (only logging it needs it)

    # Model.log is what mlflow.pyfunc.log_model calls; it alone takes the run, so the spool's thread can log to
    # the stage's run without making it the active one.
    info = Model.log(
        artifact_path=None, name="model", flavor=mlflow.pyfunc, python_model=mlflow_model.__file__,
        artifacts={mlflow_model.ARTIFACT: str(hf_dir)}, code_paths=[str(Path(vlmgym.__file__).parent)],
        model_config={"max_new_tokens": max_new_tokens}, signature=mlflow_model.signature(max_new_tokens),
        input_example=mlflow_model.input_example(), pip_requirements=pinned_requirements(),
        run_id=run_id or mlflow.active_run().info.run_id)
    # The lineage goes in with the version, so a version never exists without its `dvc.hash` (which is how the
    # evaluate stage finds it, and how a resent registration finds the one already made).
    registered = mlflow.register_model(info.model_uri, registered_name(env_name), tags=dict(lineage))
    return client.get_model_version(registered.name, registered.version)


def folder_fingerprint(folder: str | Path) -> str:
    """Each file's path, size and modification time under `folder`: whether it still holds what was exported,
    without reading (and hashing) gigabytes again."""
    import hashlib

    folder = Path(folder)
    rows = sorted(f"{p.relative_to(folder)}\0{p.stat().st_size}\0{p.stat().st_mtime_ns}"
                  for p in folder.rglob("*") if p.is_file())
    if not rows:
        raise FileNotFoundError(f"{folder}: no exported files")
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def registration(hf_dir: str | Path, env_name: str, max_new_tokens: int, lineage: Mapping[str, str]) -> dict:
    """The spool entry's fields that register `hf_dir` (send_entry sends it)."""
    return {"path": str(Path(hf_dir).resolve()), "env_name": env_name, "max_new_tokens": max_new_tokens,
            "lineage": dict(lineage), "fingerprint": folder_fingerprint(hf_dir)}


def _fail_broken_uploads(client: Any, run_id: str, experiment_id: str) -> None:
    """The run's logged models still PENDING (an upload the server's outage cut short) become FAILED: they will
    never be READY, and the registration sent again logs the model anew."""
    for model in client.search_logged_models([experiment_id], filter_string=f"source_run_id = '{run_id}'"):
        if str(getattr(model.status, "name", model.status)).upper().endswith("PENDING"):
            client.finalize_logged_model(model.model_id, "FAILED")


def register_entry(client: Any, entry: Mapping[str, Any]) -> Any:
    """Send a spooled registration: the version run entry["run_id"] registered (found when an earlier send made
    it and lost the answer), else a new one. FileNotFoundError / ValueError (which the spool passes over with a
    warning) when the folder is gone or no longer holds what was exported."""
    name, run_id = registered_name(entry["env_name"]), entry["run_id"]
    made = client.search_model_versions(f"name = '{name}' and tags.`vlmgym.run_id` = '{run_id}'")
    if made:
        return max(made, key=lambda v: int(v.version))
    path = Path(entry["path"])
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: gone since the export run {run_id}, which registers it; run the export "
                                "stage again (`dvc repro -f -s export`)")
    if folder_fingerprint(path) != entry["fingerprint"]:
        raise ValueError(f"{path} changed since the export run {run_id} that registers it, so it is not "
                         f"registered; run the export stage again (`dvc repro -f -s export`)")
    import mlflow

    experiment_id = client.get_run(run_id).info.experiment_id
    _fail_broken_uploads(client, run_id, experiment_id)
    # MLflow files a logged model under the active experiment, whatever its run's: `vlmgym tracking sync` has none
    mlflow.set_experiment(experiment_id=experiment_id)
    return log_and_register(path, entry["env_name"], max_new_tokens=entry["max_new_tokens"], client=client,
                            lineage=entry["lineage"], run_id=run_id)


def send_entry(client: Any, tracking_uri: str | None, entry: Mapping[str, Any]) -> None:
    """Send a spool entry of kind `register` or `promote` to the server at `tracking_uri` (vlmgym.tracking.spool).
    A failure to reach the server raises (the spool retries); a registration says its version on stdout."""
    import mlflow

    if tracking_uri and mlflow.get_tracking_uri() != tracking_uri:  # logging a model goes through MLflow's globals
        mlflow.set_tracking_uri(tracking_uri)
    if entry["kind"] == "promote":
        promote(client, entry["env_name"], entry["model_hash"], entry["value"], figure=entry["figure"],
                run_id=entry["run_id"])
        return
    version = register_entry(client, entry)
    print(f"export: registered {version.name} version {version.version} "
          f"(mlflow.pyfunc.load_model('models:/{version.name}/{version.version}'))", flush=True)


@dataclass(frozen=True)
class Promotion:
    """What promote_if_better did: the evaluated version, its figure, who holds `champion` before and after."""

    name: str
    version: str
    figure: float
    champion: str  # the version holding the alias afterwards
    previous: str | None  # the version that held it before (None: none did)
    previous_figure: float | None  # the figure recorded on `previous`

    @property
    def moved(self) -> bool:
        return self.champion != self.previous


def _warn(message: str) -> None:
    print(f"evaluate: WARNING: {message}", file=sys.stderr, flush=True)


def exported_version(client: Any, env_name: str, model_hash: str) -> Any:
    """The newest version of registered_name(env_name) whose `dvc.hash` tag is `model_hash` (the export stage
    tags each version with its folder's DVC hash); None when no version has it."""
    name = registered_name(env_name)
    versions = client.search_model_versions(f"name = '{name}' and tags.`dvc.hash` = '{model_hash}'")
    return max(versions, key=lambda v: int(v.version), default=None)


def _recorded(version: Any, figure: str) -> float | None:
    try:
        value = float(version.tags.get(EVAL_TAG_PREFIX + figure, "nan"))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def promote_if_better(client: Any, env_name: str, model_hash: str | None, value: float | None, *,
                      figure: str = HEADLINE, run_id: str | None = None) -> Promotion | None:
    """promote() that never raises: an unreachable registry prints one warning and returns None."""
    try:
        return promote(client, env_name, model_hash, value, figure=figure, run_id=run_id)
    except Exception as err:  # the registry is a convenience: it never fails the stage
        reason = (str(err).splitlines() or [""])[0]
        _warn(f"the model registry could not be updated ({type(err).__name__}: {reason}): the {CHAMPION} alias "
              f"of {registered_name(env_name)} stays where it was")
        return None


def promote(client: Any, env_name: str, model_hash: str | None, value: float | None, *,
            figure: str = HEADLINE, run_id: str | None = None) -> Promotion | None:
    """Record an evaluated version's figure and move the `champion` alias to it when it earns it.

    The version is the newest of `vlmgym-<env>` (registered_name) whose `dvc.hash` tag is `model_hash`, the DVC
    hash of the evaluated transformers folder. It gets the tags `vlmgym.eval.<figure>` = `value` (and
    `vlmgym.eval.run_id` = `run_id`, the evaluate run). The rule: the version becomes `champion` when the model
    has no champion yet, or when `value` is strictly higher than the `vlmgym.eval.<figure>` recorded on the
    champion; a tie, a lower figure, or a champion with no recorded figure (an alias set by hand) leaves the alias
    where it is. Only versions of the same registered model, so of the same env, are ever compared.

    A version not found (the export stage did not register the folder) or a missing figure prints one warning and
    returns None; otherwise one line says what happened. A registry that cannot be reached raises.
    """
    name = registered_name(env_name)
    if value is None or not math.isfinite(float(value)):
        _warn(f"no finite {figure} to record on {name}: the {CHAMPION} alias stays where it was")
        return None
    value = float(value)
    evaluated = exported_version(client, env_name, model_hash) if model_hash else None
    if evaluated is None:
        _warn(f"no version of the registered model {name} holds the evaluated folder (dvc.hash "
              f"{model_hash or 'unknown'}; the export stage registers it unless export.register is false): "
              f"the {CHAMPION} alias stays where it was")
        return None
    client.set_model_version_tag(name, evaluated.version, EVAL_TAG_PREFIX + figure, repr(value))
    if run_id:
        client.set_model_version_tag(name, evaluated.version, EVAL_TAG_PREFIX + "run_id", run_id)
    previous = client.get_registered_model(name).aliases.get(CHAMPION)
    previous = None if previous is None else str(previous)
    previous_figure = (None if previous is None or previous == str(evaluated.version)
                       else _recorded(client.get_model_version(name, previous), figure))
    earned = previous is None or (previous != str(evaluated.version) and previous_figure is not None
                                  and value > previous_figure)
    if earned:
        client.set_registered_model_alias(name, CHAMPION, evaluated.version)
    result = Promotion(name, str(evaluated.version), value, str(evaluated.version) if earned else previous,
                       previous, previous_figure)
    print(f"evaluate: {name} version {result.version} ({figure} {value:.4f}) {_verdict(result, figure)}",
          flush=True)
    return result


def _verdict(result: Promotion, figure: str) -> str:
    if result.previous is None:
        return f"is the first {CHAMPION}"
    if result.previous == result.version:
        return f"stays the {CHAMPION}"
    against = (f"version {result.previous}'s {result.previous_figure:.4f}" if result.previous_figure is not None
               else f"version {result.previous}, which has no recorded {figure}")
    if result.moved:
        return f"beats {against}: it is the {CHAMPION} now"
    return f"does not beat {against}: the {CHAMPION} stays version {result.previous}"


def evaluated_figure(run: Any, hf_dir: str | Path, policy: str,
                     results: Mapping[str, Mapping[str, float]]) -> tuple[str | None, float | None]:
    """The DVC hash of the exported folder `hf_dir` (from the run's `dvc.dep.<hf_dir>` tag, else computed; None
    when it cannot be had) and `policy`'s HEADLINE figure in `results` ({policy: {metric: value}})."""
    try:
        key = "dvc.dep." + Path(hf_dir).as_posix()
        model_hash = run.tags.get(key) or run.output_hash(hf_dir)
    except Exception as err:  # a hash that cannot be had is the "not found" case
        _warn(f"no DVC hash of {hf_dir} ({err})")
        model_hash = None
    return model_hash, (results.get(policy) or {}).get(HEADLINE)


def promote_evaluated(run: Any, env_name: str, hf_dir: str | Path, policy: str,
                      results: Mapping[str, Mapping[str, float]]) -> None:
    """The evaluate stage's promotion (promote) of the exported folder `hf_dir` judged on `policy`'s figure, queued
    on the run's spool: sent with the run's other logs, or by the next stage or `vlmgym tracking sync` when the
    server is down. Never raises; a figure that is not a finite number warns now and queues nothing."""
    model_hash, value = evaluated_figure(run, hf_dir, policy, results)
    name = registered_name(env_name)
    if value is None or not math.isfinite(float(value)):
        _warn(f"no finite {HEADLINE} to record on {name}: the {CHAMPION} alias stays where it was")
        return
    run.queue_model_entry("promote", env_name=env_name, model_hash=model_hash, value=float(value), figure=HEADLINE)
