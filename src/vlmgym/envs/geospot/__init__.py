"""geospot: GeoGuessr as RL. See env.py for the task; the package holds its data, reward, metrics and report."""

from vlmgym.envs.geospot.env import PROMPT, GeospotEnv, render_answer

__all__ = ["PROMPT", "GeospotEnv", "render_answer"]
