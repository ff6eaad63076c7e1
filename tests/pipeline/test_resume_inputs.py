"""What training resumes from is keyed by its inputs' content: a data param changed, `dvc repro sft` trains a new model
on the new data instead of resuming the old run's finished checkpoint; a shard changed behind DVC's back (same size,
same modification time, which DVC trusts) stops the stage that reads it, naming the tar and how to restore it.

Each test works in a copy of the shared micro pipeline (conftest.py), which it leaves as it is.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from pipeline_helpers import copy_of, output_digests, run_checked, stages_run

pytestmark = pytest.mark.slow

SFT_WEIGHTS = "models/jax/sft/params/"


def test_a_changed_data_seed_trains_a_new_sft_model(pipeline, tmp_path):
    root, env = copy_of(pipeline, tmp_path / "checkout")
    (root / "seed.yaml").write_text("data:\n  seed: 1\n")
    run_checked(["vlmgym", "preset", "seed.yaml", "--on-top"], root, env)
    result = run_checked(["dvc", "repro", "sft"], root, env)
    assert stages_run(result.stdout) == ["download", "shard", "sft"]
    before = {path: md5 for path, md5 in pipeline["digests"].items() if path.startswith(SFT_WEIGHTS)}
    after = {path: md5 for path, md5 in output_digests(root).items() if path.startswith(SFT_WEIGHTS)}
    assert sorted(after) == sorted(before) and after != before, "sft wrote the seed-0 model again"
    # the seed-0 run's checkpoints were not resumed: the new data has a folder of its own
    assert len(list((root / "checkpoints" / "sft").iterdir())) == 2


def test_a_shard_changed_at_the_same_size_and_time_stops_the_stage(pipeline, tmp_path):
    root, env = copy_of(pipeline, tmp_path / "checkout")
    tar = root / "data" / "shards" / "train" / "shard-000000.tar"
    original, stat = tar.read_bytes(), tar.stat()
    changed = bytearray(original)
    middle = len(changed) // 2
    changed[middle:middle + 256] = bytes(b ^ 0xFF for b in changed[middle:middle + 256])
    tar.write_bytes(bytes(changed))
    os.utime(tar, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    result = subprocess.run(["dvc", "repro", "-f", "-s", "sft"], cwd=root, env=env, capture_output=True, text=True,
                            timeout=1800)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "data/shards/train/shard-000000.tar: sha256" in output and "the tar changed after it was written" in output
    assert "dvc checkout --relink --force data/shards" in output and "dvc repro -f -s shard" in output
    # the way out the message gives: DVC's own copy of the shards, whatever their modification time says
    run_checked(["dvc", "checkout", "--relink", "--force", "data/shards"], root, env)
    assert tar.read_bytes() == original
