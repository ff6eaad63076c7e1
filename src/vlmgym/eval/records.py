"""Rollout records: one JSON object per (policy, test sample), built from an env step, stored as JSONL.

The schema the metrics and reports read (see vlmgym.eval.metrics): id, policy, env, answer, then the env's own
fields (Env.record_fields: parsed, truth and e.g. predictions), then reward, reward_components, format_ok, then
fields the env derives from the whole record (Env.finish_record, e.g. a distance to the truth).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlmgym.envs.base import Env
from vlmgym.eval.metrics import env_class
from vlmgym.runtime.atomic import atomic_file


def json_safe(value: Any) -> Any:
    """Finite numbers, strings, bools, None, and lists/dicts of them; anything else as its str; nan/inf as None."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, np.bool_ | np.integer):
        return value.item()
    if isinstance(value, float):  # np.float64 too (a float subclass json would keep as is)
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    try:
        number = float(value)  # numpy scalars
    except (TypeError, ValueError):
        return str(value)
    return number if math.isfinite(number) else None


def reward_components(info: Mapping[str, Any]) -> dict[str, Any]:
    """The env's named reward components: `info["reward_components"]`, else its k_* level scores and sub-rewards."""
    if isinstance(info.get("reward_components"), Mapping):
        return dict(info["reward_components"])
    return {k: v for k, v in info.items()
            if k.startswith("k_") or k.startswith("d_") or k in ("content_reward", "format_reward")}


def rollout_record(env: type[Env] | str, sample_id: str, answer: str, reward: float, info: Mapping[str, Any],
                   meta: Mapping[str, Any], policy: str = "") -> dict[str, Any]:
    """One JSON-safe rollout record from an env step's (answer, reward, info) and the sample's shard meta;
    `env` is an Env class or name."""
    env = env_class(env)
    record: dict[str, Any] = {"id": str(sample_id), "policy": policy, "env": env.name, "answer": answer}
    record.update(env.record_fields(info, meta))
    record["reward"] = float(reward)
    record["reward_components"] = reward_components(info)
    record["format_ok"] = bool(info.get("format_ok", False))
    return env.finish_record(json_safe(record))


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> int:
    """Write records one JSON object per line, atomically; returns how many."""
    count = 0
    with atomic_file(Path(path)) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(json_safe(record), ensure_ascii=False, allow_nan=False) + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL file of objects; a malformed line is an error naming the file and the line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from error
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
    return records


def write_metrics_json(path: str | Path, metrics: Mapping[str, Any]) -> None:
    """Write metrics (e.g. metrics/eval.json) atomically with nan/inf as null, so `dvc metrics` can read it."""
    with atomic_file(Path(path)) as tmp:
        tmp.write_text(json.dumps(json_safe(metrics), indent=2, allow_nan=False) + "\n")
