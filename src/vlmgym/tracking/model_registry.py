"""The exported model in the MLflow model registry: one registered model per env, one version per export.

The export stage logs the transformers folder as a pyfunc model (vlmgym.tracking.pyfunc_model, models-from-code: no
pickle) in its run and registers it as `vlmgym-<env>`. Each version carries lineage tags: the DVC hash of the
folder (as dvc.lock records it), the git commit, the pipeline, the DVC experiment and the run that logged it.
The logged model has a signature and an input example (vlmgym.tracking.pyfunc_model.signature / input_example).

The evaluate stage then finds the version it evaluated (the one whose `dvc.hash` is the evaluated folder's),
records its headline figure on it as the tag `vlmgym.eval.mean_reward` and moves the alias `champion` to it when it
earns it (promote_if_better: no champion yet, or a higher figure than the champion's).

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
                     lineage: Mapping[str, str]) -> Any:
    """Log `hf_dir` as the active run's pyfunc model `model` and register it under registered_name(env_name);
    the new ModelVersion, tagged with `lineage`."""
    import mlflow

    import vlmgym
    from vlmgym.tracking import pyfunc_model as mlflow_model  # the model's code (only logging it needs it)

    name = registered_name(env_name)
    info = mlflow.pyfunc.log_model(
        name="model", python_model=mlflow_model.__file__, artifacts={mlflow_model.ARTIFACT: str(hf_dir)},
        code_paths=[str(Path(vlmgym.__file__).parent)], model_config={"max_new_tokens": max_new_tokens},
        signature=mlflow_model.signature(max_new_tokens), input_example=mlflow_model.input_example(),
        pip_requirements=pinned_requirements(), registered_model_name=name)
    registered = client.get_model_version(name, str(info.registered_model_version))
    for key, value in lineage.items():
        client.set_model_version_tag(name, registered.version, key, value)
    return client.get_model_version(name, registered.version)


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
    """Record an evaluated version's figure and move the `champion` alias to it when it earns it.

    The version is the newest of `vlmgym-<env>` (registered_name) whose `dvc.hash` tag is `model_hash`, the DVC
    hash of the evaluated transformers folder. It gets the tags `vlmgym.eval.<figure>` = `value` (and
    `vlmgym.eval.run_id` = `run_id`, the evaluate run). The rule: the version becomes `champion` when the model
    has no champion yet, or when `value` is strictly higher than the `vlmgym.eval.<figure>` recorded on the
    champion; a tie, a lower figure, or a champion with no recorded figure (an alias set by hand) leaves the alias
    where it is. Only versions of the same registered model, so of the same env, are ever compared.

    Never raises: an unreachable registry, a version not found (the export stage did not register the folder) or
    a missing figure prints one warning and returns None; otherwise one line says what happened.
    """
    name = registered_name(env_name)
    try:
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
    except Exception as err:  # the registry is a convenience: it never fails the stage
        reason = (str(err).splitlines() or [""])[0]
        _warn(f"the model registry could not be updated ({type(err).__name__}: {reason}): the {CHAMPION} alias "
              f"of {name} stays where it was")
        return None
    print(f"evaluate: {name} version {result.version} ({figure} {value:.4f}) {_verdict(result, figure)}")
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


def promote_evaluated(run: Any, env_name: str, hf_dir: str | Path, policy: str,
                      results: Mapping[str, Mapping[str, float]]) -> Promotion | None:
    """The evaluate stage's promote_if_better: the version of the exported folder `hf_dir` (its DVC hash from
    the run's `dvc.dep.<hf_dir>` tag, else computed), judged on `policy`'s HEADLINE figure in `results`
    ({policy: {metric: value}}, the figures the run logs as `<policy>/<metric>`). Never raises."""
    try:
        key = "dvc.dep." + Path(hf_dir).as_posix()
        model_hash = run.tags.get(key) or run.output_hash(hf_dir)
    except Exception as err:  # a hash that cannot be had is the "not found" case
        _warn(f"no DVC hash of {hf_dir} ({err})")
        model_hash = None
    return promote_if_better(run.client, env_name, model_hash, (results.get(policy) or {}).get(HEADLINE),
                             run_id=run.run_id)
