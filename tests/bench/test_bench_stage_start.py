"""`vlmgym bench stage-start` on a checkout of two stage scripts: each stage's time to its work, and the ratio of two
checkouts."""

from __future__ import annotations

import json
import textwrap

import pytest

from vlmgym.bench import stage_start

pytestmark = pytest.mark.slow

STAGE = textwrap.dedent("""
    import sys, time
    from vlmgym.tracking.stage_runs import stage_run

    time.sleep(float(sys.argv[1]))  # what the stage does before its work
    with stage_run("{name}") as run:
        open("work-ran", "w").write("the work ran")
""")


def _checkout(root, delays):
    (root / "stages").mkdir(parents=True)
    stages = {}
    for name, delay in delays.items():
        (root / "stages" / f"{name}.py").write_text(STAGE.format(name=name))
        stages[name] = {"cmd": f"python stages/{name}.py {delay}"}
    stages["not_python"] = {"cmd": "echo skipped"}
    (root / "dvc.yaml").write_text(json.dumps({"stages": stages}))
    return root


def test_each_stage_is_timed_to_its_work_and_two_checkouts_compared(tmp_path, capsys):
    # 3 s before the slow stage's work: well above how much two cold starts' imports differ on a loaded machine
    # (0.13 s seen beside a full test run), so the gap is the wait the benchmark must count
    a = _checkout(tmp_path / "a", {"slow": 3.0, "quick": 0.0})
    b = _checkout(tmp_path / "b", {"slow": 0.0, "quick": 0.0})
    assert stage_start.main(["--repo", str(a), "--repo", str(b), "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out["stages"]) == ["slow", "quick"]  # dvc.yaml's order; the echo stage is not a python stage
    slow_a, slow_b = (out["stages"]["slow"][str(r)]["median_s"] for r in (a, b))
    quick_a = out["stages"]["quick"][str(a)]["median_s"]
    assert slow_a >= 3.0 and slow_a - quick_a >= 2.0
    assert out["stages"]["slow"]["ratio"] == round(slow_a / slow_b, 2) > 1
    assert not (a / "work-ran").exists() and not (b / "work-ran").exists()  # stopped where the work starts


def test_a_stage_that_never_starts_its_run_is_named(tmp_path):
    repo = _checkout(tmp_path / "a", {"quick": 0.0})
    (repo / "stages" / "quick.py").write_text("raise SystemExit('no inputs here')\n")
    with pytest.raises(SystemExit, match="stages/quick.py 0.0 in .* did not reach its work"):
        stage_start.main(["--repo", str(repo), "--repeats", "1"])
