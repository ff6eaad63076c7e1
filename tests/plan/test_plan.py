"""`vlmgym plan`: its per-device figures for the tiny model against the live buffers of a real step, and its CLI."""

import json
from pathlib import Path

import pytest

from vlmgym.cli import COMMANDS
from vlmgym.plan.cli import parse_args, table, with_device_count

pytestmark = pytest.mark.slow

# XLA rounds each small output buffer up (alignment): a few hundred bytes in all on the tiny model.
OUTPUT_SLACK = 4096


def test_plan_matches_the_live_buffers_of_a_real_step(run_on_cpu_devices):
    here = Path(__file__).parent
    out = json.loads(run_on_cpu_devices(2, [here / "plan_check.py"], cwd=here).strip().splitlines()[-1])
    plan, live = out["plan"]["programs"], out["live"]
    for name in ("gradients", "update"):
        # Every argument's shard, as placed for the real step, exactly.
        assert plan[name]["live_arguments"] == live[name]["arguments"], name
        assert abs(plan[name]["outputs"] - live[name]["outputs"]) <= OUTPUT_SLACK, name
    assert plan["gradients"]["arguments"] == live["gradients"]["arguments"]  # the loss reads every argument
    # The update never reads the frozen vision tower's (zero) gradients: XLA leaves them out of its count.
    assert plan["update"]["arguments"] < live["update"]["arguments"]
    # The optimizer state is sharded like the params (it was all on device 0 before init_placed) and as planned.
    assert out["opt_state_like_plan"]
    assert out["opt_state_bytes"]["device"] < 0.6 * out["opt_state_bytes"]["total"]
    assert plan["gradients"]["temporaries"] > 0 and out["plan"]["peak"]["step"] > out["plan"]["state"]["params"]
    # XLA:CPU keeps no allocator statistics: temporaries (and so the peak) are XLA's own estimate, unchecked.
    assert out["memory_stats"] is None


def test_cli_arguments(capsys):
    assert "plan" in COMMANDS
    spec, args = parse_args(["--config", "4b", "--mesh", "1,8,1", "--batch", "128", "--seq", "370", "--answer",
                             "128", "--micro-batches", "8", "--remat", "layer"])
    assert spec.devices == 8 and spec.micro_rows == 16 and spec.image == (512, 672)
    assert (spec.param_dtype, spec.dtype, spec.remat, args.no_rollout) == ("bf16", "bf16", "layer", False)
    tiny, _ = parse_args(["--config", "tiny", "--batch", "16", "--seq", "62"])
    assert (tiny.param_dtype, tiny.image) == ("fp32", (96, 128))
    for bad in (["--mesh", "2,2"], ["--batch", "12"], ["--remat", "full"], ["--image", "100x96"]):
        with pytest.raises(SystemExit):
            parse_args(["--config", "tiny", "--batch", "16", "--seq", "62", *bad])
    assert with_device_count("--xla_foo=1 --xla_force_host_platform_device_count=4", 8) == (
        "--xla_foo=1 --xla_force_host_platform_device_count=8")


def test_table_lists_every_program():
    program = {"arguments": 1, "live_arguments": 2, "outputs": 3, "aliases": 0, "temporaries": 4, "peak": 9}
    text = table({"programs": {"gradients": program, "update": program}, "state": {"params": 2},
                  "peak": {"learner": 3 * 2**30, "step": 3 * 2**30}})
    assert text.splitlines()[0].startswith("GiB per device") and "gradients" in text and "learner 3.00" in text


def test_lora_plan_holds_state_and_gradients_of_the_adapters_alone():
    from vlmgym.plan.programs import Planner, plan
    from vlmgym.plan.shapes import PlanSpec, plan_config

    cfg = plan_config("tiny")
    reports = {}
    for rank in (0, 8):
        spec = PlanSpec(config="tiny", batch=4, seq=62, answer=8, group=2, lora_rank=rank)
        spec.check()
        reports[rank] = plan(Planner(cfg, spec), rollout=False)
    t = cfg.text
    per_layer = sum(8 * (n_in + n_out) for n_in, n_out in (
        (t.hidden_size, t.num_attention_heads * t.head_dim), (t.hidden_size, t.num_key_value_heads * t.head_dim),
        (t.hidden_size, t.num_key_value_heads * t.head_dim), (t.num_attention_heads * t.head_dim, t.hidden_size),
        (t.hidden_size, t.intermediate_size), (t.hidden_size, t.intermediate_size),
        (t.intermediate_size, t.hidden_size)))
    lora, full = reports[8], reports[0]
    assert lora["trainable_parameters"] == per_layer * t.num_hidden_layers
    assert lora["state"]["grads"] == 4 * lora["trainable_parameters"]  # fp32 gradients of the adapters only
    assert 2 * lora["state"]["grads"] <= lora["state"]["opt_state"] <= 2 * lora["state"]["grads"] + 64
    assert lora["state"]["opt_state"] < full["state"]["opt_state"] / 10
    # the base is held once: params grow by the adapters (and their per-layer scales) only
    assert lora["state"]["params"] - full["state"]["params"] == lora["state"]["grads"] + 4 * 7 * t.num_hidden_layers
    with pytest.raises(ValueError, match="frozen whole"):
        PlanSpec(config="tiny", batch=4, group=2, lora_rank=8, freeze="vision").check()


def test_accelerator_flag_plans_in_this_process_on_the_devices_jax_sees(tmp_path, capsys):
    """--accelerator compiles for the devices this process has (here the test's CPU devices) without re-running
    itself under fake ones; a mesh that does not match their count is refused by name."""
    import jax

    from vlmgym.plan.cli import main

    count = jax.device_count()
    args = ["--config", "tiny", "--batch", "4", "--seq", "62", "--answer", "8", "--group", "2", "--no-rollout",
            "--accelerator", "--json", str(tmp_path / "plan.json")]
    assert main([*args, "--mesh", f"{count},1,1"]) == 0
    report = json.loads((tmp_path / "plan.json").read_text())
    assert report["device"].startswith(f"{count} x ") and report["peak"]["learner"] > report["state"]["params"]
    assert "rollout" not in report["peak"]
    with pytest.raises(RuntimeError, match=f"needs {2 * count} devices, JAX sees {count}"):
        main([*args, "--mesh", f"{2 * count},1,1"])
