"""The XLA flags every stage and `vlmgym` command runs under, set before JAX starts its CPU backend.

- `--xla_cpu_experimental_ynn_fusion_type=dot,reduce`: XLA:CPU fuses each dot with the transposes and element-wise
  work around it into one YNNPACK call. Its default fuses dots one by one and writes the transposed operands of a
  backward pass out first, in naive loops (20 ms of a 0.5 s learner update for one [384, 3072] gradient of the tiny
  model): with the fused form the learner update takes 0.6x the time (BENCHMARKS.md, "Learner").
- `--xla_force_host_platform_device_count=2`: two CPU devices, whatever the machine's core count, so that the
  rollout engine decodes two shares of the prompts at once (one XLA:CPU decode loop keeps one core busy) and the
  samples are the same on every machine. The learner stays on the first device. Not set for a multi-process run
  (each process keeps its own devices, as JAX's multi-controller runtime expects).

A flag the user set in XLA_FLAGS wins. Flags only take effect before JAX first touches a backend; `configure`
says so when it comes too late.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import MutableMapping, Sequence

FUSION_FLAG, FUSION_VALUE = "--xla_cpu_experimental_ynn_fusion_type", "dot,reduce"
DEVICE_FLAG, HOST_DEVICES = "--xla_force_host_platform_device_count", 2
MULTI_PROCESS_ARG, MULTI_PROCESS_ENV = "--num-processes", "JAX_NUM_PROCESSES"


def _multi_process(argv: Sequence[str], environ: MutableMapping[str, str]) -> bool:
    given = [a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
             for i, a in enumerate(argv) if a.split("=", 1)[0] == MULTI_PROCESS_ARG]
    given.append(environ.get(MULTI_PROCESS_ENV, ""))
    return any(value.strip() not in ("", "1") for value in given)


def stage_flags(flags: str, multi_process: bool = False) -> str:
    """XLA_FLAGS `flags` with the stages' flags added where the user set none of their own."""
    named = {item.split("=", 1)[0] for item in flags.split()}
    extra = [] if FUSION_FLAG in named else [f"{FUSION_FLAG}={FUSION_VALUE}"]
    if DEVICE_FLAG not in named and not multi_process:
        extra.append(f"{DEVICE_FLAG}={HOST_DEVICES}")
    return " ".join([flags.strip(), *extra]).strip()


def backend_started() -> bool:
    """Whether JAX has started a backend in this process (after which XLA_FLAGS are not read again)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(getattr(xla_bridge, "_backends", {}))


def configure(argv: Sequence[str] | None = None, environ: MutableMapping[str, str] | None = None) -> None:
    """Add the stages' flags to XLA_FLAGS (this process and its children)."""
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    wanted = stage_flags(environ.get("XLA_FLAGS", ""), _multi_process(argv, environ))
    if wanted == environ.get("XLA_FLAGS", "").strip():
        return
    if backend_started():
        warnings.warn("JAX started its backend before vlmgym set its XLA flags; this process runs without "
                      f"them ({wanted})", RuntimeWarning, stacklevel=2)
    environ["XLA_FLAGS"] = wanted
