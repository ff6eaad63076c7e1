"""Environment registry: names -> Env classes, imported only when first made (so importing vlmgym.envs is cheap).

An env is found by `env.name` in four ways, the first that knows the name winning:
- a built-in name (geospot, nlvr2, digits, message_decoding, rec, ovd, user_data; mixture trains on several of them
  at once) or one added with `register(name, "package.module:Class")`;
- an entry point of group `vlmgym.envs` of an installed package, e.g. in its pyproject.toml
  `[project.entry-points."vlmgym.envs"]` then `colour = "my_package.colour:ColourEnv"`;
- a plug-in of the project's plug-in folder (PLUGIN_DIR, beside params.yaml): `plugins/colour.py` (or a package
  `plugins/colour/`) whose Env subclass is named `colour`, found as `env.name: colour`;
- `package.module:Class` itself (importable from sys.path; the working directory is tried too, so a module
  beside params.yaml works, and `plugins.colour:ColourEnv` names a plug-in's class), registered under the class's
  `name` on first use.

The `env` section of params.yaml (EnvParams) lives here too: its name and each env's own settings mean something
only through the registry. Validation (vlmgym.config.spec.from_dict) looks env names and the envs' sections up in
this module, which vlmgym.params passes to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vlmgym.config.spec import ParamsError, spec
from vlmgym.envs.base import Env

ENTRY_POINT_GROUP = "vlmgym.envs"
# The project's plug-in folder, under the working directory (the stages run in the repository root, beside
# params.yaml). dvc.yaml lists it as a dep of every stage that builds an env, which a module elsewhere is not: an
# edit to a plug-in there reruns the stages it can change rather than reusing their stale results.
PLUGIN_DIR = "plugins"
DEFAULT_ENV = "geospot"
# The envs shipped with vlmgym.
BUILTIN: dict[str, str] = {
    "geospot": "vlmgym.envs.geospot:GeospotEnv",
    "nlvr2": "vlmgym.envs.nlvr2:NLVR2Env",
    "digits": "vlmgym.envs.digits:DigitsEnv",
    "message_decoding": "vlmgym.envs.message_decoding:MessageDecodingEnv",
    "rec": "vlmgym.envs.rec:RecEnv",
    "ovd": "vlmgym.envs.ovd:OvdEnv",
    "user_data": "vlmgym.envs.user_data:UserDataEnv",
    "mixture": "vlmgym.envs.mixture:MixtureEnv",
}
# The envs whose texts the tiny tokenizer is always trained on, fixed rather than all of BUILTIN: the default
# tokenizer, and so the default model and every committed result, stays the same when an env is added. Any other
# active env (a later built-in or a plug-in) adds its texts after these.
TOKENIZER_ENVS = ("geospot", "nlvr2")

_REGISTRY: dict[str, str | type[Env]] = dict(BUILTIN)


def register(name: str, target: str | type[Env], *, overwrite: bool = False) -> None:
    """Register an env class, or a 'module:Class' string imported on first use, under `name`."""
    if not name or not isinstance(name, str) or ":" in name:
        raise ValueError(f"env name must be a non-empty string without ':', got {name!r}")
    if name in _REGISTRY and not overwrite and not _same(_REGISTRY[name], target):
        raise ValueError(f"env {name!r} is already registered as {_REGISTRY[name]!r}; pass overwrite=True")
    if isinstance(target, str) and target.count(":") != 1:
        raise ValueError(f"env {name!r}: target {target!r} must look like 'package.module:ClassName'")
    if not isinstance(target, str) and not (isinstance(target, type) and issubclass(target, Env)):
        raise TypeError(f"env {name!r}: target must be an Env subclass or a 'module:Class' string, got {target!r}")
    _REGISTRY[name] = target


@contextlib.contextmanager
def scoped_registrations() -> Iterator[None]:
    """Undo, when the block ends, whatever `register` did inside it (a test's or a notebook's envs stay its own)."""
    saved = dict(_REGISTRY)
    try:
        yield
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)


def _same(a: str | type[Env], b: str | type[Env]) -> bool:
    def text(t: str | type[Env]) -> str:
        return t if isinstance(t, str) else f"{t.__module__}:{t.__qualname__}"

    return a is b or text(a) == text(b)


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def plugin_names() -> list[str]:
    """The plug-ins of the working directory's PLUGIN_DIR, sorted: each module `<name>.py` and package `<name>/`
    (one with an `__init__.py`) whose name is an identifier not starting with `_`; [] without the folder."""
    folder = Path(PLUGIN_DIR)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        if path.suffix == ".py" and path.is_file():
            found.append(path.stem)
        elif (path / "__init__.py").is_file():
            found.append(path.name)
    return sorted(name for name in found if name.isidentifier() and not name.startswith("_"))


def names() -> list[str]:
    """Known env names (registered, entry points and the plug-in folder's), sorted."""
    return sorted(set(_REGISTRY) | set(_entry_points()) | set(plugin_names()))


def is_known(name: str) -> bool:
    """Whether `name` is a registered env, an entry point or a plug-in of the plug-in folder (a 'module:Class'
    string is not a name)."""
    return name in _REGISTRY or name in _entry_points() or name in plugin_names()


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        # `python stages/x.py` puts stages/ first on sys.path, not the working directory: try it too.
        if os.getcwd() in sys.path or not module_name.startswith(err.name or "\0"):
            raise
        sys.path.append(os.getcwd())
        return importlib.import_module(module_name)


def _load(target: str, what: str) -> type[Env]:
    module_name, _, class_name = target.partition(":")
    try:
        cls = getattr(_import(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"{what}: cannot load {target!r}: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise TypeError(f"{what}: {target!r} is not an Env subclass")
    return cls


def _load_plugin(name: str) -> type[Env]:
    """The Env subclass named `name` that the plug-in folder's module (or package) `name` defines."""
    module_name, where = f"{PLUGIN_DIR}.{name}", Path(PLUGIN_DIR) / name
    try:
        module = _import(module_name)
    except ImportError as err:
        raise ImportError(f"env {name!r}: cannot import the plug-in {where}: {err}") from err
    folder = Path(PLUGIN_DIR).resolve()
    origin = Path(getattr(module, "__file__", None) or "").resolve()
    if not origin.is_relative_to(folder):
        # another importable package called PLUGIN_DIR came first on sys.path
        raise ImportError(f"env {name!r}: {module_name} was imported from {origin}, not from {folder}; rename the "
                          f"package that shadows the plug-in folder, or give env.name as 'module:Class'")
    # its own classes: an Env class it imports (a base it subclasses, another plug-in) is not its env
    defined = list(dict.fromkeys(cls for cls in vars(module).values()
                                 if isinstance(cls, type) and issubclass(cls, Env) and cls is not Env
                                 and (cls.__module__ == module_name or cls.__module__.startswith(module_name + "."))))
    named = [cls for cls in defined if cls.name == name]
    if len(named) != 1:
        classes = ", ".join(f"{cls.__qualname__} (name {cls.name!r})" for cls in defined) or "none"
        raise ImportError(f"env {name!r}: the plug-in {where} must define one Env subclass whose `name` is "
                          f"{name!r}, it defines {classes}; or give env.name as '{module_name}:Class'")
    return named[0]


def env_class(name: str) -> type[Env]:
    """The class for `name`: registered, an entry point, a plug-in of the plug-in folder, or 'package.module:Class'
    (each registered on first use)."""
    if not isinstance(name, str) or not name:
        raise KeyError(f"env name must be a non-empty string, got {name!r}")
    if ":" in name:
        cls = _load(name, f"env {name!r}")
        if not is_known(cls.name):
            register(cls.name, cls)
        elif not _same(env_class(cls.name), cls):
            raise ValueError(f"env {name!r} is named {cls.name!r}, which is already the env "
                             f"{_REGISTRY.get(cls.name) or _entry_points()[cls.name]!r}; give it another name")
        return cls
    if name not in _REGISTRY:
        points = _entry_points()
        if name in points:
            _REGISTRY[name] = points[name]
        elif name in plugin_names():
            _REGISTRY[name] = _load_plugin(name)
        else:
            raise KeyError(f"unknown env {name!r}; known: {', '.join(names())} (or give 'package.module:Class', "
                           f"or add {PLUGIN_DIR}/{name}.py)")
    target = _REGISTRY[name]
    if isinstance(target, str):
        cls = _load(target, f"env {name!r}")
        _REGISTRY[name] = target = cls
    return target


def make(name: str, **kwargs) -> Env:
    """Build the env `name` (see env_class) with `kwargs` (e.g. shards_dir=, split=, samples=, tokenizer=)."""
    return env_class(name)(**kwargs)


def corpus(active: str | Sequence[str] | None = None) -> list[str]:
    """The tokenizer corpus: the TOKENIZER_ENVS' texts in name order, then each active env's (a name, or several
    in order: a mixture's sub-envs, see parts) that is another one (so neither a new built-in env nor an installed
    plug-in package changes the default tokenizer)."""
    texts: list[str] = []
    for name in sorted(TOKENIZER_ENVS):
        texts.extend(env_class(name).corpus())
    seen = set(TOKENIZER_ENVS)
    for name in [active] if isinstance(active, str) else list(active or ()):
        cls = env_class(name)
        if cls.name not in seen:
            seen.add(cls.name)
            texts.extend(cls.corpus())
    return texts


@dataclasses.dataclass(frozen=True)
class EnvParams:
    """The environment the policy is trained and evaluated on."""

    name: str = spec(DEFAULT_ENV, env_name=True,
                     doc="the task: a registered env name, an entry point (vlmgym.envs) or 'package.module:Class'")
    recipe: str = spec("", doc="the env whose recipe the other sections hold (`vlmgym recipe <env>` writes it and "
                           "name); a stage stops when it is not name, so switching env.name alone never trains a task "
                           "with another's settings ('': settings chosen by hand, run as they are)")
    sections: dict[str, Any] = spec(default_factory=dict, env_sections="Params",
                                    doc="each env's own settings (reward, report), under its name")

    def __post_init__(self) -> None:
        if self.recipe and self.recipe != self.name:
            raise ParamsError(f"env.name is {self.name!r} but env.recipe is {self.recipe!r}: the other sections "
                              f"hold the settings of that env's recipe. `vlmgym recipe {self.name}` applies this env's "
                              f"(or `dvc exp run $(vlmgym recipe {self.name} --overrides)`); env.recipe: '' runs "
                              "these settings as they are")

    def settings(self) -> Any:
        """The active env's section (env.<its name>), its defaults when absent; None when it takes none."""
        cls = env_class(self.name)
        section = self.sections.get(cls.name)
        if section is None and cls.Params is not None:
            section = cls.Params()
        return section


def parts(env_params: EnvParams) -> list[str]:
    """The envs whose data, tokenizer texts and reports the configured env uses: its own name, or a mixture's
    sub-envs in name order (env.mixture.envs)."""
    if env_class(env_params.name).name != "mixture":
        return [env_params.name]
    return sorted(env_params.settings().envs)


def part_params(env_params: EnvParams, name: str) -> EnvParams:
    """The `env` section for one sub-env `name` of a mixture on its own: its name, the same sections, and no recipe
    (env.recipe names the mixture's, which a sub-env on its own does not run under)."""
    return dataclasses.replace(env_params, name=name, recipe="")


def split_dirs(env_params: EnvParams, shards_dir: str | Path, split: str) -> list[Path]:
    """The shard folders a split of the configured env is read from: shards_dir/<split>, or each sub-env's
    shards_dir/<name>/<split> for a mixture."""
    if not has_parts(env_params):
        return [Path(shards_dir) / split]
    return [Path(shards_dir) / name / split for name in parts(env_params)]


def has_parts(env_params: EnvParams) -> bool:
    """Whether the configured env is a mixture of several (vlmgym.envs.mixture)."""
    return env_class(env_params.name).name == "mixture"


def from_params(env_params: EnvParams, *, shards_dir: str, split: str, tokenizer: Any = None, limit: int = 0,
                progress: float | None = None) -> Env:
    """The configured env (params section `env`: its name and its own settings) over the first `limit` samples
    (0: all) of a split of the shards, decoding answers with `tokenizer`; scoring at a fixed curriculum
    `progress` when given (rollout and evaluation score at 1, the final reward)."""
    cls = env_class(env_params.name)
    if cls.name == "mixture":  # its sub-envs from their own sections and shard folders
        env = cls.build(env_params, shards_dir=shards_dir, split=split, tokenizer=tokenizer, limit=limit or None)
    else:
        env = cls(shards_dir=shards_dir, split=split, tokenizer=tokenizer, limit=limit or None,
                  params=env_params.settings())
    if progress is not None:
        env.set_progress(progress)
    return env
