"""digits: sort or add the handwritten digits in an image. See env.py; data.py composes its images."""

from vlmgym.envs.digits.env import DigitsEnv, read_integers, sort_credit

__all__ = ["DigitsEnv", "read_integers", "sort_credit"]
