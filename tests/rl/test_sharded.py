"""The sharded path: a GRPO update on a 2x2 (data x fsdp) mesh of fake CPU devices equals the single-device one."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_sharded_update_equals_single_device(tiny_vlm, run_on_cpu_devices):
    here = Path(__file__).parent
    stdout = run_on_cpu_devices(4, [here / "sharded_step.py", tiny_vlm.folder], cwd=here)
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["input_sharding"] != "PartitionSpec()"  # the batch really is split over devices
    assert out["loss"][1] == pytest.approx(out["loss"][0], rel=1e-5)
    assert out["grad_norm"][1] == pytest.approx(out["grad_norm"][0], rel=1e-4)
    assert out["logprob_diff"] < 1e-5
    assert out["grad_diff"] < 1e-5
    shared = out["shared"]  # the shared-prefix update, prompts and their groups split alike over the devices
    assert shared["prompts"] == 4 and shared["prompt_sharding"] == shared["row_sharding"] != "PartitionSpec()"
    assert shared["loss"][1] == pytest.approx(shared["loss"][0], rel=1e-5)
    assert shared["logprob_diff"] < 1e-5
    assert shared["grad_diff"] < 1e-5
    knobs = out["knobs"]  # GSPO, the sampler correction and the entropy mask on the sharded shared-prefix update
    assert knobs["loss"][1] == pytest.approx(knobs["loss"][0], rel=1e-5) and knobs["loss"][0] != 0
    assert knobs["kept"][0] == knobs["kept"][1] > 0 and knobs["scale"] > 0
    assert knobs["grad_diff"] < 1e-5
