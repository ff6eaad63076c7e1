"""ovd: open-vocabulary detection, every object of the named categories. See env.py; scene.py and data.py hold
the data, parse.py the answer parser, rewards.py and vlm_r1.py the rewards, metrics.py COCO's mAP, report.py the
page."""

from vlmgym.envs.ovd.env import OvdEnv, OvdParams

__all__ = ["OvdEnv", "OvdParams"]
