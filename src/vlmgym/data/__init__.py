"""Data: the raw layout (OSV-5M hub download or the synthetic world), webdataset shards, and their reader."""

from __future__ import annotations

from typing import Any

__all__ = ["Sample", "read_split"]


def __getattr__(name: str) -> Any:
    # Lazy: importing webdataset takes seconds, and most users of vlmgym.data only need the layout helpers.
    if name in __all__:
        from vlmgym.data import shards

        return getattr(shards, name)
    raise AttributeError(f"module 'vlmgym.data' has no attribute {name!r}")
