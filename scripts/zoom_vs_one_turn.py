"""One-turn against zoom digits over seeds: each policy's figures and the paired differences with two-level bootstrap
intervals (seeds, then samples), from two `vlmgym compare --seeds 3 --first-seed 3 --arms grpo` outputs: one in a
checkout switched with `vlmgym recipe digits`, one with the zoom presets on top (docs/envs/digits.md).

    python scripts/zoom_vs_one_turn.py ONE_TURN_OUT ZOOM_OUT [test test_ood]

Prints the tables and writes zoom_vs_one_turn.json beside ZOOM_OUT. SEEDS=3,4,5 (the default) picks the seeds."""
import json
import os
import sys
from pathlib import Path

from vlmgym.compare.seeds import per_seed_table, seed_results
from vlmgym.eval.records import read_jsonl

SEEDS = [int(s) for s in os.environ.get("SEEDS", "3,4,5").split(",")]
POLICIES = ["grpo", "zoom_sft", "zoom_grpo", "sft_blind", "zoom_sft_blind", "constant"]
ONE, ZOOM = Path(sys.argv[1]), Path(sys.argv[2])
EPISODE_KEYS = ("episode_turns", "turns", "turn_tokens", "tool_calls")
FIGURES = ("mean_reward", "accuracy")


def strip(records):
    return [{k: v for k, v in r.items() if k not in EPISODE_KEYS} for r in records]


def arm(folder, seed, name, split):
    return read_jsonl(folder / f"seed{seed}" / name / f"{split}.jsonl")


out = {}
for split in sys.argv[3:] or ("test", "test_ood"):
    per_seed = [{"sft": arm(ONE, s, "sft", split), "grpo": arm(ONE, s, "grpo", split),
                 "zoom_sft": strip(arm(ZOOM, s, "sft", split)), "zoom_grpo": strip(arm(ZOOM, s, "grpo", split)),
                 "sft_blind": arm(ONE, s, "sft_blind", split),
                 "zoom_sft_blind": strip(arm(ZOOM, s, "sft_blind", split)),
                 "constant": read_jsonl(ONE / "constant" / f"{split}.jsonl")}
                for s in SEEDS]
    results = seed_results("digits", per_seed, POLICIES, n_resamples=1000, seed=0, confidence=0.95,
                           comparisons=[("zoom_grpo", "grpo"), ("zoom_grpo", "zoom_sft")])
    out[split] = results
    print(f"## {split}")
    for name, flat in results.items():
        cells = [f"{f} {flat[f]:+.3f} [{flat[f + '_ci_low']:+.3f}, {flat[f + '_ci_high']:+.3f}]" for f in FIGURES
                 if f in flat]
        print(name, " | ".join(cells))
    print(per_seed_table(results, SEEDS))
(ZOOM.parent / "zoom_vs_one_turn.json").write_text(json.dumps(out, indent=1))
