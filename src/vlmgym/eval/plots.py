"""Moved to vlmgym.stats.plots: this old path gives that module and warns (DeprecationWarning)."""

from vlmgym.eval.moved import moved_module

moved_module(__name__, "vlmgym.stats.plots")
