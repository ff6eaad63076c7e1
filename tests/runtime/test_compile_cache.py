"""Where vlmgym keeps compiled programs (vlmgym.runtime.compile_cache), and that a process turning it on before its
first compile writes them there and the next process loads them."""

from __future__ import annotations

import os
import subprocess
import sys

from vlmgym.runtime import compile_cache

SCRIPT = """
import json, sys
from vlmgym.runtime import compile_cache
print(json.dumps(str(compile_cache.enable())))
import jax, jax.numpy as jnp
def gram_tanh(x):
    return jnp.tanh(x @ x.T).sum()
print(json.dumps(float(jax.jit(gram_tanh)(jnp.ones((64, 64))))))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "VLMGYM_COMPILE"))}
    return {**env, **extra}


def test_the_folder_is_per_machine_kind_under_the_user_cache_unless_chosen_or_off(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.folder() == tmp_path / "vlmgym" / "jax" / compile_cache.machine_kind()
    assert compile_cache.machine_kind() == compile_cache.machine_kind()
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "mine"))
    assert compile_cache.folder() == tmp_path / "mine"
    for off in ("off", "0", "false", "no", "OFF"):
        monkeypatch.setenv(compile_cache.VARIABLE, off)
        assert compile_cache.folder() is None


def test_jax_own_setting_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.JAX_VARIABLE, str(tmp_path / "jax-own"))
    monkeypatch.setenv(compile_cache.VARIABLE, str(tmp_path / "vlmgym"))
    assert compile_cache.enable() is None
    assert os.environ[compile_cache.JAX_VARIABLE] == str(tmp_path / "jax-own")


def test_a_program_compiled_in_one_process_loads_in_the_next(tmp_path):
    cache = tmp_path / "cache"
    # every program kept (the default keeps those of 0.1 s or more); JAX names each one it loads from the cache
    env = _clean_env(VLMGYM_COMPILE_CACHE=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                     JAX_LOG_COMPILES="1")
    runs = [subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert runs[0].stdout.splitlines()[0] == f'"{cache}"'
    assert any(cache.glob("jit_gram_tanh-*-cache"))
    assert "cache hit for 'jit_gram_tanh'" not in runs[0].stderr
    assert "cache hit for 'jit_gram_tanh'" in runs[1].stderr
    assert runs[0].stdout == runs[1].stdout  # the loaded program computes what the compiled one did

    off = subprocess.run([sys.executable, "-c", SCRIPT], env={**env, "VLMGYM_COMPILE_CACHE": "off"},
                         capture_output=True, text=True, check=True)
    assert off.stdout.splitlines()[0] == '"None"' and "cache hit" not in off.stderr


def test_a_folder_that_cannot_be_made_is_named_and_the_process_runs_without_a_cache(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = _clean_env(VLMGYM_COMPILE_CACHE=str(blocker / "cache"), JAX_LOG_COMPILES="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[0] == '"None"'
    assert f"compilation cache off: cannot create {blocker / 'cache'}" in done.stderr
