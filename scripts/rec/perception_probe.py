"""Can the perception warm-up teach the tiny vision tower where rec's objects are? rec's shards carry no scene
labels, so this generates rec scenes itself and runs the warm-up (vlmgym.rl.perception) on labels per image: for
each of the 24 kinds of object (size x colour x shape), none or the cell (of a 4 x 3 grid over the image) holding
the centre of its first object, 13 classes. Run in a checkout whose base model is built (`dvc repro convert`):

    python scripts/rec/perception_probe.py [--images 4000] [--steps 3000] [--lr 0.001] [--scale 1]

Every 500 steps it prints, on 256 test scenes, the share of labels right, of present kinds whose cell is right
(a tower that sees nothing gets 0: it answers none) and of absent kinds called absent."""
import argparse
import dataclasses
import io
import time
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
from PIL import Image

from vlmgym.data import layout
from vlmgym.envs.nlvr2.data import COLOURS, SHAPES, SIZES
from vlmgym.envs.rec import data as rec_data
from vlmgym.params import load_section
from vlmgym.rl import perception
from vlmgym.rl.stage_setup import stage_policy

KINDS = [(size, colour, shape) for size in SIZES for colour in sorted(COLOURS) for shape in SHAPES]
WIDTH, HEIGHT, COLUMNS, ROWS = 256, 192, 4, 3


def cells(scene) -> list[int]:
    """Per kind: 0 when absent, else 1 + the grid cell of its first object's centre."""
    out = [0] * len(KINDS)
    for obj in scene:
        kind = KINDS.index((obj.size, obj.colour, obj.shape))
        if not out[kind]:
            out[kind] = 1 + min(int(obj.y / HEIGHT * ROWS), ROWS - 1) * COLUMNS + min(int(obj.x / WIDTH * COLUMNS),
                                                                                     COLUMNS - 1)
    return out


class Scenes:
    """Generated rec scenes as the warm-up reads an env: samples with one image, labels in meta."""

    name = "rec"
    perception_heads = (1 + COLUMNS * ROWS,) * len(KINDS)

    def __init__(self, split: str, count: int, scale: float):
        settings = dataclasses.replace(rec_data.RecDataParams(), object_scale=scale)
        self.samples = []
        for sample in rec_data.generate_split(0, split, count, WIDTH, HEIGHT, settings):
            jpg = layout.encode_jpeg(rec_data.render(sample, 0, split, WIDTH, HEIGHT))
            self.samples.append(SimpleNamespace(key=sample.id, images=[Image.open(io.BytesIO(jpg)).convert("RGB")],
                                                meta={"cells": cells(sample.scene)}))

    def __len__(self) -> int:
        return len(self.samples)

    @staticmethod
    def perception_labels(meta: dict) -> list[int]:
        return meta["cells"]


class Probe(perception.PerceptionWarmup):
    def evaluate(self, trained) -> dict[str, float]:
        """The warm-up's figures on the held-out scenes, split into present and absent kinds (most labels are
        'absent')."""
        pixels, _, labels = self.val
        predicted = []
        for start in range(0, len(pixels), 32):
            logits = self._predict(trained, jnp.asarray(pixels[start:start + 32]))
            predicted.append(np.stack([np.asarray(head).argmax(-1) for head in logits], axis=1))
        right, present = np.concatenate(predicted) == labels, labels > 0
        return {"perception/val_label_accuracy": float(right.mean()),
                "perception/present_cell_right": float(right[present].mean()),
                "perception/absent_right": float(right[~present].mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000, help="train scenes generated")
    parser.add_argument("--steps", type=int, default=3000, help="warm-up steps")
    parser.add_argument("--lr", type=float, default=0.001, help="warm-up peak learning rate")
    parser.add_argument("--scale", type=float, default=1.0, help="data.rec.object_scale")
    args = parser.parse_args()
    start = time.time()
    train, test = Scenes("train", args.images, args.scale), Scenes("test", 256, args.scale)
    print(f"{len(train)} train and {len(test)} test scenes in {time.time() - start:.0f} s", flush=True)
    sft, model = load_section("sft", "params.yaml"), load_section("model", "params.yaml")
    section = dataclasses.replace(sft.perception, steps=args.steps, eval_every=500,
                                  optimizer=dataclasses.replace(sft.perception.optimizer, lr=args.lr))
    policy, params = stage_policy("sft", sft, model)

    def log(step: int, metrics: dict[str, float]) -> None:
        if "perception/present_cell_right" in metrics:
            shown = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in metrics.items())
            print(f"step {step}: {shown} ({time.time() - start:.0f} s)", flush=True)

    Probe(policy.cfg, params, policy.processor.settings, train, test, section, log=log,
                                progress_bar=False).run()


if __name__ == "__main__":
    main()
