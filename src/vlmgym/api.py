"""The plug-in API: every name an env or a tool written outside vlmgym imports, from one place.

`from vlmgym.api import ...` is the door the guides use (docs/writing-an-env.md, docs/multi-turn.md). These
names keep working across releases: when one moves inside the package it is still exported here, and a moved
module keeps its old path for at least one release, warning (a DeprecationWarning naming the new place) on import.

- the env: `Env` (subclass it), `State` and `SampleLike` (what `reset` and `score` see), `make` and `register`;
- its settings: `spec` (one validated, documented field of a `Params` or `DataParams` dataclass), `ParamsError`,
  and `ThinkParams` (subclass it for the think/answer option);
- its data: `layout` (the raw layout's CSV and zip writers), `RowSchema`, `Row`, `RowSkip` and `SAFE_KEY`;
- its metrics: `Statistic` (per-sample values the shared bootstrap gives intervals for);
- its tools (docs/multi-turn.md): `Tool`, `ToolResult`, `ToolError`, `ToolParams` (subclass it for the tools
  option) and `BUILTIN_TOOLS`.
"""

from vlmgym.data import layout
from vlmgym.data.rows import SAFE_KEY, Row, RowSchema, RowSkip
from vlmgym.envs import Env, SampleLike, State, make, register
from vlmgym.envs.multiturn import ToolParams
from vlmgym.envs.think import ThinkParams
from vlmgym.envs.tools import BUILTIN_TOOLS, Tool, ToolError, ToolResult
from vlmgym.params import ParamsError, spec
from vlmgym.stats.bootstrap import Statistic

__all__ = ["BUILTIN_TOOLS", "SAFE_KEY", "Env", "ParamsError", "Row", "RowSchema", "RowSkip", "SampleLike", "State",
           "Statistic", "ThinkParams", "Tool", "ToolError", "ToolParams", "ToolResult", "layout", "make", "register",
           "spec"]
