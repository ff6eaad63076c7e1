"""A persistent XLA compilation cache for every stage: a program compiled once (the learner's step, the sampler's
prefill and decode) loads from disk in the next stage or run that builds it again, instead of compiling afresh.

A loaded program is the compiled program itself, so results are bit for bit those of a fresh compile. XLA:CPU
compiles for the host's own instruction set, so the folder is per machine kind (CPU model and features, JAX
version): a home folder shared by machines of several kinds never hands one a program built for another.

    VLMGYM_COMPILE_CACHE=off      no cache
    VLMGYM_COMPILE_CACHE=FOLDER   this folder instead of ~/.cache/vlmgym/jax/<machine kind>
    JAX_COMPILATION_CACHE_DIR     set by you: JAX's own setting wins and vlmgym leaves every cache setting alone
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path

VARIABLE = "VLMGYM_COMPILE_CACHE"
JAX_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
# Only programs that take this long to compile are kept: the model's steps and decoders, not the many tiny array
# ops (each write scans the folder for the size limit).
MIN_COMPILE_S = 0.1
MAX_BYTES = 8 << 30  # the size limit (least recently used entries go first); it also turns on JAX's file lock


def machine_kind() -> str:
    """A short digest of what a compiled XLA:CPU program depends on: architecture, CPU model and features, and
    the jax and jaxlib versions (read from their metadata: importing JAX here would be too early)."""
    from importlib import metadata

    cpu = platform.processor()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))
    except OSError:
        pass
    versions = []
    for package in ("jax", "jaxlib"):
        try:
            versions.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            versions.append("-")
    text = "\n".join([platform.machine(), cpu, *versions])
    return f"{platform.machine()}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def folder() -> Path | None:
    """Where this process's compiled programs are kept (None: no cache)."""
    chosen = os.environ.get(VARIABLE, "")
    if chosen.lower() in ("off", "0", "false", "no"):
        return None
    if chosen:
        return Path(chosen).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME", "") or Path.home() / ".cache")
    return base / "vlmgym" / "jax" / machine_kind()


def enable() -> Path | None:
    """Turn the cache on for this process (and the processes it starts); the folder, or None when off or when
    JAX_COMPILATION_CACHE_DIR was set already. JAX decides once, at its first compile, whether a process uses a
    cache: call this before anything is compiled."""
    if os.environ.get(JAX_VARIABLE):
        return None
    path = folder()
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a read-only home: the stage runs on, compiling as it would without the cache
        print(f"vlmgym: compilation cache off: cannot create {path} ({error.strerror}); set {VARIABLE} to a "
              f"writable folder or to off", file=sys.stderr)
        return None
    settings = {JAX_VARIABLE: str(path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": str(MIN_COMPILE_S),
                "JAX_COMPILATION_CACHE_MAX_SIZE": str(MAX_BYTES)}
    for name, value in settings.items():
        os.environ.setdefault(name, value)
    if "jax" in sys.modules:  # JAX read the variables at its import: set its config as well
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ[JAX_VARIABLE])
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
        jax.config.update("jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]))
    return path
