"""Can the perception warm-up teach the tiny vision tower where rec's objects are? This generates rec scenes at
any `data.rec.object_scale` and runs the warm-up (vlmgym.rl.perception) on rec's labels (RecEnv.perception_labels:
for each of the 24 kinds of object, none or the cell of a 4 x 3 grid holding its first object's centre; with
--tokens also RecEnv.perception_token_labels: each merged token's object kind and centre bins), outside the
pipeline. Run in a checkout whose base model is built (`dvc repro convert`):

    python scripts/rec/perception_probe.py [--images 4000] [--steps 3000] [--lr 0.001] [--scale 1]
        [--tokens] [--no-image-heads] [--max-pixels N]

Every 500 steps it prints, on 256 test scenes, the share of labels right, of present kinds whose cell is right
(a tower that sees nothing gets 0: it answers none) and of absent kinds called absent; with --tokens, the share of
token labels right among the tokens that hold an object's centre (0 for a tower that sees nothing): the kind, both
centre bins, both within a bin.
--max-pixels sets the image budget (model.max_pixels: 12288 gives a 256x192 image 12 tokens, 49152 48)."""
import argparse
import dataclasses
import io
import time
from types import SimpleNamespace

from PIL import Image

from vlmgym.data import layout
from vlmgym.envs.rec import RecEnv
from vlmgym.envs.rec import data as rec_data
from vlmgym.envs.rec.env import parse_objects as rec_objects
from vlmgym.params import load_section
from vlmgym.rl import perception
from vlmgym.rl.stage_setup import stage_policy

WIDTH, HEIGHT = 256, 192


class Scenes:
    """Generated rec scenes as the warm-up reads an env: samples with one image and the scene in meta, as the shard
    stage keeps it (rec_data.objects_text, then rec's parse_objects)."""

    name = "rec"
    perception_labels = staticmethod(RecEnv.perception_labels)
    perception_token_labels = staticmethod(RecEnv.perception_token_labels)
    perception_view = RecEnv.perception_view

    def __init__(self, split: str, count: int, scale: float, image_heads: bool, tokens: bool):
        self.perception_heads = RecEnv.perception_heads if image_heads else ()
        self.perception_token_heads = RecEnv.perception_token_heads if tokens else ()
        settings = dataclasses.replace(rec_data.RecDataParams(), object_scale=scale)
        self.samples = []
        for sample in rec_data.generate_split(0, split, count, WIDTH, HEIGHT, settings):
            jpg = layout.encode_jpeg(rec_data.render(sample, 0, split, WIDTH, HEIGHT))
            objects = rec_objects(rec_data.objects_text((o.size, o.colour, o.shape, o.x, o.y) for o in sample.scene),
                                  WIDTH, HEIGHT)
            self.samples.append(SimpleNamespace(key=sample.id, images=[Image.open(io.BytesIO(jpg)).convert("RGB")],
                                                meta={"id": sample.id, "objects": objects}))

    def __len__(self) -> int:
        return len(self.samples)


class Probe(perception.PerceptionWarmup):
    def evaluate(self, trained) -> dict[str, float]:
        """The warm-up's figures on the held-out scenes, split into present and absent kinds (most labels are
        'absent')."""
        image, tokens = self.val_predictions(trained)
        metrics = {}
        if self.heads:
            labels = self.val.labels
            right, present = image == labels, labels > 0
            metrics.update({"perception/val_label_accuracy": float(right.mean()),
                            "perception/present_cell_right": float(right[present].mean()),
                            "perception/absent_right": float(right[~present].mean())})
        if self.token_heads:
            labels = self.val.token_labels
            shown = labels[..., 0] > 0
            right = tokens[shown] == labels[shown]  # (tokens holding a centre, kind / x bin / y bin)
            metrics.update({"perception/token_kind_right": float(right[:, 0].mean()),
                            "perception/token_place_right": float(right[:, 1:].all(axis=1).mean()),
                            "perception/token_place_within_a_bin": float(
                                (abs(tokens[shown][:, 1:] - labels[shown][:, 1:]) <= 1).all(axis=1).mean()),
                            "perception/empty_token_right": float((tokens[~shown] == 0).all(axis=1).mean())})
        return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=4000, help="train scenes generated")
    parser.add_argument("--steps", type=int, default=3000, help="warm-up steps")
    parser.add_argument("--lr", type=float, default=0.001, help="warm-up peak learning rate")
    parser.add_argument("--scale", type=float, default=1.0, help="data.rec.object_scale")
    parser.add_argument("--tokens", action="store_true", help="also warm up on rec's token labels")
    parser.add_argument("--no-image-heads", action="store_true", help="leave out the per-kind image heads")
    parser.add_argument("--max-pixels", type=int, default=0, help="image budget (0: the base model's)")
    args = parser.parse_args()
    if args.no_image_heads and not args.tokens:
        parser.error("--no-image-heads leaves no labels without --tokens")
    start = time.time()
    train, test = (Scenes(split, count, args.scale, not args.no_image_heads, args.tokens)
                   for split, count in (("train", args.images), ("test", 256)))
    print(f"{len(train)} train and {len(test)} test scenes in {time.time() - start:.0f} s", flush=True)
    sft, model = load_section("sft", "params.yaml"), load_section("model", "params.yaml")
    section = dataclasses.replace(sft.perception, steps=args.steps, eval_every=500,
                                  optimizer=dataclasses.replace(sft.perception.optimizer, lr=args.lr))
    policy, params = stage_policy("sft", sft, model)
    settings = policy.processor.settings
    if args.max_pixels:
        settings = dataclasses.replace(settings, max_pixels=args.max_pixels)

    def log(step: int, metrics: dict[str, float]) -> None:
        if len(metrics) > 1:
            shown = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in metrics.items())
            print(f"step {step}: {shown} ({time.time() - start:.0f} s)", flush=True)

    Probe(policy.cfg, params, settings, train, test, section, log=log, progress_bar=False).run()


if __name__ == "__main__":
    main()
