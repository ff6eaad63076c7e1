"""Pieces of `vlmgym bench rollout` that decide what it reports."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vlmgym.bench import main as bench_main
from vlmgym.bench.common import decode_bytes_per_step, decode_flops_per_token, measure_matmul_flops
from vlmgym.bench.rollout import compare_greedy, parse_args
from vlmgym.models.qwen3_vl.config import named_config

pytestmark = pytest.mark.slow


def test_compare_greedy_cuts_after_eos_and_reports_first_difference():
    eos = [2]
    same = compare_greedy([[5, 6, 2, 9]], [[5, 6, 2, 0]], eos)  # after EOS: HF pads, JAX pads; ignored
    assert same["greedy_equal"] and same["greedy_rows_equal"] == 1
    differ = compare_greedy([[5, 6, 7, 2], [1, 2, 0, 0]], [[5, 6, 8, 2], [1, 2, 0, 0]], eos)
    assert not differ["greedy_equal"] and differ["greedy_rows_equal"] == 1
    assert differ["greedy_first_difference"] == {"row": 0, "position": 2, "jax": [7, 2], "hf": [8, 2]}
    # One side stopping at EOS where the other continues is a difference too.
    assert not compare_greedy([[5, 2, 0]], [[5, 6, 2]], eos)["greedy_equal"]


def test_flops_and_bytes_of_the_4b_decoder():
    cfg = named_config("4b")
    # 36 layers x (2560 x (4096 + 4096 + 1024 + 1024) + 3 x 2560 x 9728) + lm_head 2560 x 151936 weights.
    weights = 36 * (2560 * (2 * 4096 + 2 * 1024) + 3 * 2560 * 9728) + 2560 * 151936
    assert decode_flops_per_token(cfg, 0) == 2 * weights
    assert decode_flops_per_token(cfg, 100) - decode_flops_per_token(cfg, 0) == 36 * 4 * 4096 * 100
    # KV: 144 KiB per token in bf16 (reference figure), per row.
    kv_per_token = decode_bytes_per_step(cfg, 64, 1, 2, 2) - decode_bytes_per_step(cfg, 64, 0, 2, 2)
    assert kv_per_token == 64 * 144 * 1024


def test_matmul_measure_is_not_hoisted():
    small = measure_matmul_flops(8, 16, 32, repeats=2)
    assert 1e6 < small["median"] <= small["best"] < 5e12  # a hoisted loop would report absurd FLOP/s


def test_cli_arguments():
    with pytest.raises(SystemExit):
        parse_args(["--config", "4b"])  # needs --random-weights
    args = parse_args(["--config", "4b", "--random-weights", "--dtype", "bf16"])
    assert args.prompts == 8 and args.group == 8 and args.max_new_tokens == 48
    assert bench_main(["--help"]) == 0 and bench_main(["nonexistent"]) == 2
    assert np.isclose(parse_args([]).hbm_bandwidth, 4.8e12)


def test_hbm_roofline_figures():
    from vlmgym.bench.rollout import hbm_figures

    cfg = named_config("4b", "bf16", "bf16")
    figures = hbm_figures(cfg, rows=64, context=200.0, steps=100, decode_s=0.5, bandwidth=4.8e12)
    assert figures["decode_step_s"] == 0.005
    assert figures["bytes_per_step"] == decode_bytes_per_step(cfg, 64, 200.0, 2, 2)
    # ~8 GB of bf16 decoder + lm_head weights and ~1.9 GB of KV in 5 ms is ~2 TB/s: ~41% of an H200.
    assert 0.35 < figures["hbm_roofline_fraction"] < 0.45


def test_devices_argument_and_worker_flag(monkeypatch):
    with pytest.raises(SystemExit):
        parse_args(["--devices", "-1"])
    import subprocess

    from vlmgym.bench import rollout as benchmark

    seen = {}

    def fake_run(cmd, capture_output, text, env):
        seen["flags"] = env.get("XLA_FLAGS", "")
        return subprocess.CompletedProcess(cmd, 0, stdout='{"ok": 1}\n', stderr="")

    monkeypatch.setattr(benchmark.subprocess, "run", fake_run)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert benchmark._run_worker("jax", Path("/nonexistent"), 3) == {"ok": 1}
    assert seen["flags"] == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=3"
    benchmark._run_worker("jax", Path("/nonexistent"), 1)
    assert "device_count" not in seen["flags"]


def test_benchmark_end_to_end_on_two_devices(bench_model_dir, capsys):
    # The whole command on the tiny test model: both workers, the prompts split over two host devices, greedy
    # outputs compared with transformers token for token.
    code = bench_main(["rollout", "--model", str(bench_model_dir), "--prompts", "3", "--group", "2",
                       "--max-new-tokens", "6", "--repeats", "1", "--devices", "2"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["greedy_equal"] and report["greedy_rows"] == 3
    jax_side = report["jax"]
    assert jax_side["devices"] == 2 and jax_side["generated_tokens"] == 3 * 2 * 6
    assert jax_side["recompiles"] == 0 and jax_side["tokens_per_s"] > 0 and report["hf"]["tokens_per_s"] > 0
    assert 0 < jax_side["roofline_fraction"] < 1
