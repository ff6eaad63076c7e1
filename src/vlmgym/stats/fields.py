"""Reading a rollout record's fields with errors that name the record (vlmgym.eval.metrics lists the fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def record_field(record: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a rollout record must be a JSON object, got {type(record).__name__}")
    if key not in record:
        raise ValueError(f"{where}: rollout record has no {key!r} field")
    return record[key]


def record_where(record: Any, index: int) -> str:
    sample_id = record.get("id") if isinstance(record, Mapping) else None
    return f"record {index} (id {sample_id!r})"
