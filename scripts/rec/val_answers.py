"""What a rec policy answers on the val split: does it name the right object, and where does it put the box? Greedy
answers of a model folder (a stage's output, e.g. models/jax/sft) on the val shards, with the env section of
params.yaml (so the prompt is the one the model was trained on). Run in a checkout whose shards are built:

    python scripts/rec/val_answers.py models/jax/sft [--samples 256]

It prints, for all samples and split into expressions with and without a relation: the share whose answer's label
is the target's whole description (the object named), the mean IoU and accuracy at IoU 0.5, and the correlation of
the answered box's centre with the true one in x and in y (0 for boxes placed without regard to the image)."""
import argparse
import json

import numpy as np

from vlmgym import envs
from vlmgym.envs.rec.boxes import iou
from vlmgym.envs.rec.parse import parse_answer
from vlmgym.envs.rec.scene import parse_expression
from vlmgym.params import load_section
from vlmgym.rl.stage_setup import load_policy

BATCH = 32


def answered_label(text: str) -> str | None:
    """The label of the answer's first object, or None when the answer is not that JSON."""
    try:
        value = json.loads(text)
        return value[0].get("label") if isinstance(value, list) and value and isinstance(value[0], dict) else None
    except ValueError:
        return None


def centre(box) -> tuple[float, float]:
    return (box[0] + box[2]) / 2, (box[1] + box[3]) / 2


def summary(rows: list[dict]) -> str:
    boxed = [r for r in rows if r["box"] is not None]
    text = (f"n={len(rows)}: label right {np.mean([r['label_right'] for r in rows]):.3f}, "
            f"mean IoU {np.mean([r['iou'] for r in rows]):.3f}, "
            f"acc@0.5 {np.mean([r['iou'] >= 0.5 for r in rows]):.3f}")
    if len(boxed) > 2:
        truth = np.array([centre(r["truth"]) for r in boxed])
        answered = np.array([centre(r["box"]) for r in boxed])
        text += (f", centre correlation x {np.corrcoef(truth[:, 0], answered[:, 0])[0, 1]:.3f} "
                 f"y {np.corrcoef(truth[:, 1], answered[:, 1])[0, 1]:.3f} ({len(boxed)} boxes)")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a vlmgym model folder (models/jax/sft, models/jax/grpo)")
    parser.add_argument("--samples", type=int, default=256, help="val samples answered (the first ones)")
    args = parser.parse_args()
    env_params, model, sft = (load_section(name, "params.yaml") for name in ("env", "model", "sft"))
    policy, params = load_policy(args.model_dir, model, sft.max_target_tokens)
    env = envs.from_params(env_params, shards_dir=sft.shards_dir, split="val", tokenizer=policy.processor.tokenizer)
    count, rows = min(args.samples, len(env)), []
    for start in range(0, count, BATCH):
        resets = [env.reset(i) for i in range(start, min(start + BATCH, count))]
        observations = [o for _, o in resets]
        observations += [observations[-1]] * (BATCH - len(observations))  # one shape: one compile
        for (state, _), text in zip(resets, policy.greedy(params, observations).texts):
            meta, box = state.meta, parse_answer(text).box
            expression = parse_expression(meta["expression"])
            rows.append({"relation": expression is not None and expression.relation is not None,
                         "label_right": answered_label(text) == meta["label"], "box": box,
                         "truth": meta["bbox_2d"], "iou": iou(box, tuple(meta["bbox_2d"])) if box else 0.0})
    print("all", summary(rows))
    for name, relation in (("without a relation", False), ("with a relation", True)):
        print(name, summary([r for r in rows if r["relation"] == relation]))


if __name__ == "__main__":
    main()
