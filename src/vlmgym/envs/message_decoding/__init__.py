"""message_decoding: decode a coded word with the letter table in the image. See env.py; data.py draws the words and
codes, render.py the tables."""

from vlmgym.envs.message_decoding.env import MessageDecodingEnv, char_credit, read_word

__all__ = ["MessageDecodingEnv", "char_credit", "read_word"]
