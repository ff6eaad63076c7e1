"""Old paths of modules that moved out of vlmgym.eval, kept for at least one release.

Importing an old path gives the new module and warns (a DeprecationWarning naming the new place), pointing at the
file that imported it: `vlmgym.eval.bootstrap` is `vlmgym.stats.bootstrap`, `vlmgym.eval.plots` is
`vlmgym.stats.plots`. A plug-in imports `Statistic` from `vlmgym.api`.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType


def moved_module(old: str, new: str) -> ModuleType:
    """Make `old` (the calling alias module) the module `new`, warning the code that imported it."""
    module = importlib.import_module(new)
    warnings.warn(f"{old} moved to {new}; import it from there (a plug-in: from vlmgym.api), the old path goes "
                  "in a later release", DeprecationWarning, stacklevel=_importer_stacklevel())
    sys.modules[old] = module
    return module


def _importer_stacklevel() -> int:
    # Point the warning at the module whose import ran the alias, so that the user's file is named and warning
    # filters by module apply to it. warnings.warn skips importlib's frames itself: count only the others.
    frame, level = sys._getframe(2), 2  # 1: moved_module, 2: the alias module
    while frame is not None:
        internal = "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename
        name = frame.f_globals.get("__name__", "")
        if not internal and not name.startswith("vlmgym.eval.") and name != "importlib":
            return level
        frame, level = frame.f_back, level + (not internal)
    return level
