"""nlvr2: is a statement about a left and a right image true? See env.py; data.py makes or downloads its data."""

from vlmgym.envs.nlvr2.env import NLVR2Env, answer_word, parse_answer

__all__ = ["NLVR2Env", "answer_word", "parse_answer"]
