"""Environments: the Env base class, the registry (`make`, `register`) and the joint tokenizer corpus."""

from vlmgym.envs.base import Env, SampleLike, State
from vlmgym.envs.registry import corpus, env_class, make, names, register

__all__ = ["Env", "SampleLike", "State", "corpus", "env_class", "make", "names", "register"]
