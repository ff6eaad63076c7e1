"""rec: referring-expression comprehension, the box of the one object an expression describes. See env.py; boxes.py
holds the 0-1000 box convention, parse.py the answer parser, scene.py and data.py the data, report.py the page."""

from vlmgym.envs.rec.boxes import iou, pixels_to_qwen, qwen_to_pixels
from vlmgym.envs.rec.env import RecEnv, RecParams
from vlmgym.envs.rec.parse import parse_answer

__all__ = ["RecEnv", "RecParams", "iou", "parse_answer", "pixels_to_qwen", "qwen_to_pixels"]
