"""Environments: the Env base class (the plug-in interface), the registry (`make`, `register`, `env_class`) and
the tokenizer corpus. Each task lives in one module or package here (geospot/, nlvr2/) or in another package."""

from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.registry import (
    DEFAULT_ENV,
    corpus,
    env_class,
    from_params,
    has_parts,
    make,
    names,
    part_params,
    parts,
    register,
    split_dirs,
)

__all__ = ["DEFAULT_ENV", "Env", "SampleLike", "State", "corpus", "env_class", "from_params", "has_parts", "make",
           "names", "part_params", "parts", "register",
           "split_dirs"]
