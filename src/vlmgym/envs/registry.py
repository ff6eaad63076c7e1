"""Environment registry: names -> classes, imported only when first made (so importing vlmgym.envs is cheap)."""

from __future__ import annotations

import importlib

from vlmgym.envs.base import Env

_REGISTRY: dict[str, str | type[Env]] = {
    "geospot": "vlmgym.envs.geospot:GeospotEnv",
    "nlvr2": "vlmgym.envs.nlvr2:NLVR2Env",
}


def register(name: str, target: str | type[Env], *, overwrite: bool = False) -> None:
    """Register an env class, or a 'module:Class' string imported on first use, under `name`."""
    if not name or not isinstance(name, str):
        raise ValueError(f"env name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and not overwrite and _REGISTRY[name] != target:
        raise ValueError(f"env {name!r} is already registered as {_REGISTRY[name]!r}; pass overwrite=True")
    if isinstance(target, str) and target.count(":") != 1:
        raise ValueError(f"env {name!r}: target {target!r} must look like 'package.module:ClassName'")
    if not isinstance(target, str) and not (isinstance(target, type) and issubclass(target, Env)):
        raise TypeError(f"env {name!r}: target must be an Env subclass or a 'module:Class' string, got {target!r}")
    _REGISTRY[name] = target


def names() -> list[str]:
    """Registered env names, sorted."""
    return sorted(_REGISTRY)


def env_class(name: str) -> type[Env]:
    """The class registered under `name`, importing its module if needed."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown env {name!r}; registered: {', '.join(names())}")
    target = _REGISTRY[name]
    if isinstance(target, str):
        module_name, class_name = target.split(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as err:
            raise ImportError(f"env {name!r}: cannot load {target!r}: {err}") from err
        if not (isinstance(cls, type) and issubclass(cls, Env)):
            raise TypeError(f"env {name!r}: {target!r} is not an Env subclass")
        _REGISTRY[name] = target = cls
    return target


def make(name: str, **kwargs) -> Env:
    """Build the env registered under `name` with `kwargs` (e.g. shards_dir=, split=, samples=, tokenizer=)."""
    return env_class(name)(**kwargs)


def corpus() -> list[str]:
    """All registered envs' tokenizer corpora, concatenated in name order."""
    texts: list[str] = []
    for name in names():
        texts.extend(env_class(name).corpus())
    return texts
