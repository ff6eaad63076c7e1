"""user_data's TRL-style reward functions: `module:function` names in env.user_data.rewards, called as TRL calls them.

A function is `f(completions, **columns) -> list[float]`: `completions` holds the answers (as strings with
`completions: text`, or as TRL's conversational form `[[{"role": "assistant", "content": answer}]]` with
`completions: chat`, which VLM-R1's functions read as `completion[0]["content"]`), `prompts` the questions in the
same form (`[question]`, or `[[{"role": "user", "content": question}]]`), and each column of the row comes as a
list beside them (`solution`, `problem`, the data's own columns). vlmgym scores one answer at a time, so every
list has one item; the function returns one value.

The module is imported like an env's `module:Class`: an importable module, or one beside params.yaml, e.g. a file
of the project's plug-in folder whose name starts with `_` (`plugins._rewards:my_reward`), which is no env.

Failures, decided as: stop early, never silently, never mid-run.
- When the env is built (every stage that scores), each function is called once on the first sample's ideal
  answer: a function that cannot be imported, raises, returns something other than a list of one number, or a
  non-finite number stops the stage with a RewardFunctionError naming the function and what it returned.
- Later (a long GRPO run), a call that raises or returns such a value gives that function's share the minimum, 0,
  for that answer, never a crash: the answer's info carries `reward_errors` {function: message}, the reward
  component `reward_function_failed` is 1 (the train stage logs its mean as `reward/reward_function_failed`), and
  the first failures of each function are logged as warnings with the message.
- `None` (TRL's "does not apply to this sample") scores 0. Values are clipped to [0, 1], the env's reward range.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
WARNINGS_PER_FUNCTION = 5
FAILED = "reward_function_failed"


class RewardFunctionError(ValueError):
    """A user's reward function is broken (cannot be imported, raises, returns a wrong length or a non-finite
    value)."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


def is_function_name(name: str) -> bool:
    """Whether a reward name is `module:function` rather than a named reward."""
    return ":" in name


def component_name(name: str) -> str:
    """The reward component (and MLflow metric) a function's value is logged under: its name with `:` as `.`."""
    return re.sub(r"[^A-Za-z0-9_.\-/]", ".", name)


def load(name: str) -> Callable[..., Any]:
    """The function `module:function` names (the working directory is tried too, as for env names)."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr or ":" in attr:
        raise RewardFunctionError(f"reward function {name!r}: write it as 'module:function'")
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if os.getcwd() in sys.path or not module_name.startswith(err.name or "\0"):
                raise
            sys.path.append(os.getcwd())
            module = importlib.import_module(module_name)
        function = getattr(module, attr)
    except (ImportError, AttributeError) as err:
        raise RewardFunctionError(f"reward function {name!r}: cannot load it: {err}") from err
    except Exception as err:  # the module itself raised on import
        raise RewardFunctionError(f"reward function {name!r}: importing {module_name} raised "
                                  f"{type(err).__name__}: {err}") from err
    if not callable(function):
        raise RewardFunctionError(f"reward function {name!r}: {attr} is not callable")
    return function


def as_batch(text: str, role: str, form: str) -> list[Any]:
    """TRL's `completions` (role assistant) or `prompts` (role user) for one text: [text], or
    [[{"role": role, "content": text}]]."""
    return [text] if form == "text" else [[{"role": role, "content": text}]]


def call(name: str, function: Callable[..., Any], answer: str, columns: Mapping[str, Any], form: str,
         prompt: str = "") -> float:
    """The function's value for one answer, checked; a RewardFunctionError naming the function otherwise."""
    try:
        values = function(prompts=as_batch(prompt, "user", form), completions=as_batch(answer, "assistant", form),
                          **{k: [v] for k, v in columns.items() if k not in ("prompts", "completions")})
    except Exception as err:  # a user's function: any error is reported, naming it
        raise RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err}") from err
    try:
        values = list(values)
    except TypeError:
        raise RewardFunctionError(f"reward function {name!r} returned {type(values).__name__}, expected a list of "
                                  "one number per completion") from None
    if len(values) != 1:
        raise RewardFunctionError(f"reward function {name!r} returned {len(values)} values for 1 completion")
    value = values[0]
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) and not hasattr(value, "__float__"):
        raise RewardFunctionError(f"reward function {name!r} returned {value!r}, expected a number")
    value = float(value)
    if not math.isfinite(value):
        raise RewardFunctionError(f"reward function {name!r} returned {value}, not a finite number")
    return min(1.0, max(0.0, value))


@dataclass
class Functions:
    """The loaded functions of a reward list, and how many times each has failed during the run."""

    form: str = "chat"
    loaded: dict[str, Callable[..., Any]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, names: list[str], form: str) -> Functions:
        return cls(form, {name: load(name) for name in names})

    def check(self, answer: str, columns: Mapping[str, Any], prompt: str = "") -> None:
        """Call each function once (the env's build): a broken one stops here, named."""
        for name, function in self.loaded.items():
            call(name, function, answer, columns, self.form, prompt)

    def score(self, answer: str, columns: Mapping[str, Any],
              prompt: str = "") -> tuple[dict[str, float], dict[str, str]]:
        """({function: value}, {function: error message}) for one answer; a failed function scores 0."""
        values, errors = {}, {}
        for name, function in self.loaded.items():
            try:
                values[name] = call(name, function, answer, columns, self.form, prompt)
            except RewardFunctionError as err:
                values[name], errors[name] = 0.0, str(err)
                count = self.failures[name] = self.failures.get(name, 0) + 1
                if count <= WARNINGS_PER_FUNCTION:
                    log.warning("%s (failure %d; the answer gets 0 from it%s)", err, count,
                                "; further failures are counted in reward/reward_function_failed, not logged"
                                if count == WARNINGS_PER_FUNCTION else "")
        return values, errors
