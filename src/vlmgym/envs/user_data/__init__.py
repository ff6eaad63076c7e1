"""user_data: your own data without code (a VLM-R1 jsonl, a `datasets` folder or parquet files), named rewards and
TRL-style reward functions. See env.py; read.py and data.py read the files, rewards.py and functions.py score."""

from vlmgym.envs.user_data.env import UserDataEnv, UserDataParams

__all__ = ["UserDataEnv", "UserDataParams"]
