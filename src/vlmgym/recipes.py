"""An env's recipe as a params overlay: what `vlmgym recipe <env>` (vlmgym.cli.recipes) writes, and the params of a
study on another env (vlmgym.compare.own_data).

An env's recipe is its class attribute `Env.recipe`: a partial params mapping over the other sections (e.g.
{"sft": {"optimizer": {"lr": 0.001}}}). Applying env X sets env.name and env.recipe to X and every key that any
registered env's recipe sets to X's value, or to the key's default where X's recipe leaves it out, so moving from
one env to another never keeps the first one's settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from vlmgym import params as params_mod


def paths(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from paths(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def _shared(path: tuple[str, ...]) -> bool:
    """Whether a recipe key is one of its section's own keys (True) or under an env's own section such as
    data.<env>, which only that env reads, so other envs need not reset it (False)."""
    section = path[0]
    if section not in params_mod.SECTIONS or section == "env" or len(path) < 2:
        raise params_mod.ParamsError(f"recipe key {'.'.join(path)}: a recipe sets keys of the sections other "
                                     "than env (its own settings are env.<name>'s defaults)")
    fields = {f.name: f for f in dataclasses.fields(params_mod.SECTIONS[section])}
    if path[1] in fields:
        return True
    if not any(f.metadata.get("env_sections") for f in fields.values()):
        raise params_mod.ParamsError(f"recipe key {'.'.join(path)}: no such key in params")
    return False


def _default(path: tuple[str, ...]) -> Any:
    section, *keys = path
    value: Any = params_mod.to_dict(params_mod.SECTIONS[section]())
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            raise params_mod.ParamsError(f"recipe key {'.'.join(path)}: no such key in params")
        value = value[key]
    return value


def recipe_overlay(name: str) -> dict[str, Any]:
    """The partial params mapping that switches to env `name` with its recipe (module docstring)."""
    from vlmgym import envs

    target = envs.env_class(name)  # an error naming the env when it is unknown
    own = dict(paths(target.recipe))
    keys = dict.fromkeys(own)
    for path in own:
        _shared(path)  # an error for a key outside the sections a recipe may set
    for other in envs.names():
        keys.update(dict.fromkeys(p for p, _ in paths(envs.env_class(other).recipe) if _shared(p)))
    overlay: dict[str, Any] = {"env": {"name": name, "recipe": name}}
    for path in keys:
        node = overlay
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = own[path] if path in own else _default(path)
    return overlay
