"""The exported model in the MLflow model registry: one registered model per env, one version per export.

The export stage logs the transformers folder as a pyfunc model (vlmgym.tracking.pyfunc_model, models-from-code: no
pickle) in its run and registers it as `vlmgym-<env>`. Each version carries lineage tags: the DVC hash of the
folder (as dvc.lock records it), the git commit, the pipeline, the DVC experiment and the run that logged it.

    model = mlflow.pyfunc.load_model("models:/vlmgym-<env>/latest")
    model.predict([{"image": open("photo.jpg", "rb").read(), "prompt": "Where was this photo taken? ..."}])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from vlmgym.tracking import pyfunc_model as mlflow_model

# What loading the model needs beside vlmgym's own source (logged with it as code).
REQUIREMENTS = ("mlflow", "transformers", "torch", "pillow", "numpy", "safetensors", "tokenizers", "jinja2")


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

    name = registered_name(env_name)
    info = mlflow.pyfunc.log_model(
        name="model", python_model=mlflow_model.__file__, artifacts={mlflow_model.ARTIFACT: str(hf_dir)},
        code_paths=[str(Path(vlmgym.__file__).parent)], model_config={"max_new_tokens": max_new_tokens},
        pip_requirements=pinned_requirements(), registered_model_name=name)
    registered = client.get_model_version(name, str(info.registered_model_version))
    for key, value in lineage.items():
        client.set_model_version_tag(name, registered.version, key, value)
    return client.get_model_version(name, registered.version)
