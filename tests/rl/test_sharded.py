"""The sharded path: a GRPO update on a 2x2 (data x fsdp) mesh of fake CPU devices equals the single-device one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_sharded_update_equals_single_device(tiny_vlm):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    here = Path(__file__).parent
    result = subprocess.run([sys.executable, str(here / "sharded_step.py"), tiny_vlm.folder], env=env, cwd=here,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["input_sharding"] != "PartitionSpec()"  # the batch really is split over devices
    assert out["loss"][1] == pytest.approx(out["loss"][0], rel=1e-5)
    assert out["grad_norm"][1] == pytest.approx(out["grad_norm"][0], rel=1e-4)
    assert out["logprob_diff"] < 1e-5
    assert out["grad_diff"] < 1e-5
