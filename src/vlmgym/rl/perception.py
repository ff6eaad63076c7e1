"""Perception warm-up: the vision tower learns what the env's images show before SFT asks it to answer.

A random tiny vision tower learns a digit's or a shape's form far too slowly from the answer loss alone (one token
of a short answer per image), so SFT on such envs settles on one constant answer. Here the tower and temporary
linear heads are trained directly on the env's class labels, with Adam on a cosine schedule; the heads are then
dropped and SFT starts from the warmed tower. Only the `visual` parameters change. Two kinds of labels, an env gives
either or both:

- image labels (`Env.perception_labels`, e.g. how many of each digit an image holds), read by one head over all of
  the image's merged tokens in place;
- token labels (`Env.perception_token_labels`, e.g. the table cell under each token), read from each token alone by
  a head the tokens share, so every token comes to carry what its own part of the image shows: what the language
  model can look up by content (attend to the token that holds a coded letter, read its plain letter).

It runs on one device, over full weights (no mesh, no adapters, one process), and needs every image of the split
at one size (the synthetic generators' images are), because the head reads the tokens in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from vlmgym.envs.base import Env, MissingPart
from vlmgym.models.checkpoint import load_checkpoint, save_checkpoint
from vlmgym.models.family import family_of
from vlmgym.models.qwen3_vl.processor import ImageSettings, preprocess_images
from vlmgym.params import SFTParams
from vlmgym.rl.loop import NonFiniteError, non_finite_message, non_finite_params
from vlmgym.tracking.step_curve import StepJournal

Log = Callable[[int, dict[str, float]], None]
SUMMARY_FILE = "perception.json"  # the warm-up's last figures, beside its checkpoint: a resumed SFT reports them
CURVE_DIR = "perception_curve"  # in the SFT checkpoint folder: the warm-up's step journal (StepJournal)


def check_supported(section: SFTParams, env: Env, processes: int) -> None:
    """Raise MissingPart for an env without labels, a ValueError naming the setting the warm-up cannot run with."""
    if env.perception_source() is None:
        raise MissingPart(f"env {env.name!r} has no perception labels (perception_heads and "
                          "perception_token_heads are empty), so "
                          "sft.perception cannot warm its vision tower up; set sft.perception.steps: 0")
    if section.lora.rank:
        raise ValueError("sft.perception trains the vision tower's full weights; it does not run with "
                         "sft.lora.rank > 0 (set sft.perception.steps: 0)")
    if len(section.mesh) and int(np.prod(section.mesh)) > 1 or processes > 1:
        raise ValueError("sft.perception runs on one device in one process; set sft.mesh: [] or "
                         "sft.perception.steps: 0")


class Split(NamedTuple):
    """A split held whole: float16 halves its memory (12,000 images of 12 tokens: 1.8 GB); the tower reads float32."""

    pixels: np.ndarray  # (n, patches, dim) float16
    grid: np.ndarray  # (t, h, w) patches of every image
    labels: np.ndarray  # (n, image heads)
    token_labels: np.ndarray  # (n, merged tokens, token heads)


def _checked(label: Any, heads: tuple[int, ...], heads_name: str, where: str) -> list[int]:
    label = [int(v) for v in label]
    if len(label) != len(heads) or not all(0 <= v < n for v, n in zip(label, heads)):
        raise ValueError(f"sft.perception: labels {label} of {where} do not fit its {heads_name} {heads}")
    return label


def split_arrays(env: Env, settings: ImageSettings, what: str, merge: int = 2) -> Split:
    """Every sample of `env` as pixel rows and labels (`merge`: the tower's spatial merge size)."""
    heads, token_heads = tuple(env.perception_heads), tuple(env.perception_token_heads)
    pixels, labels, token_labels, grid = None, [], [], None
    for index in tqdm(range(len(env)), desc=f"perception {what}", unit="image", leave=False):
        sample = env.samples[index]
        if len(sample.images) != 1:
            raise ValueError(f"sft.perception: {what} sample {sample.key} has {len(sample.images)} images; the "
                             "warm-up reads one per sample")
        image, meta = env.perception_view(sample.images[0], dict(sample.meta))
        rows, thw = preprocess_images([image], settings=settings)
        if grid is None:
            # filled in place: stacking a list of them would hold the split twice (12,000 images of 12 tokens: 1.8 GB)
            grid, pixels = thw[0], np.empty((len(env), *rows.shape), np.float16)
        elif not np.array_equal(thw[0], grid):
            raise ValueError(f"sft.perception: {what} sample {sample.key} has a {tuple(thw[0])} patch grid, the "
                             f"first sample {tuple(grid)}; the warm-up's head needs one image size")
        where = f"{env.name} {what} sample {sample.key}"
        labels.append(_checked(env.perception_labels(meta), heads, "perception_heads", where) if heads else [])
        if token_heads:
            rows_cols = (int(grid[1]) // merge, int(grid[2]) // merge)
            per_token = env.perception_token_labels(meta, *rows_cols)
            if len(per_token) != rows_cols[0] * rows_cols[1]:
                raise ValueError(f"sft.perception: {env.name} gave {len(per_token)} token labels for {what} sample "
                                 f"{sample.key}, whose image has {rows_cols[0]} x {rows_cols[1]} tokens")
            token_labels.append([_checked(t, token_heads, "perception_token_heads", where) for t in per_token])
        pixels[index] = rows
    if pixels is None:
        raise ValueError(f"sft.perception: the {what} split of {env.name} has no samples to warm up on")
    count = len(env)
    return Split(pixels, np.asarray(grid), np.asarray(labels, np.int32).reshape(count, len(heads)),
                 np.asarray(token_labels, np.int32) if token_heads else np.zeros((count, 0, 0), np.int32))


def _classes(heads: list[jax.Array], shape: tuple[int, ...]) -> np.ndarray:
    """Each head's most likely class, heads on the last axis: the labels' `shape` (empty when there are no heads)."""
    if not heads:
        return np.zeros(shape, np.int32)
    return np.stack([np.asarray(head).argmax(-1) for head in heads], axis=-1)


class PerceptionWarmup:
    """Trains params["visual"] and a linear head on (images, labels); `run` returns the params with the new tower."""

    def __init__(self, cfg: Any, params: Any, settings: ImageSettings, env: Env, val_env: Env | None,
                 section: SFTParams, log: Log | None = None, progress_bar: bool = True):
        self.cfg, self.section, self.log, self.progress_bar = cfg, section, log, progress_bar
        self.params = params
        self.heads = tuple(env.perception_heads)
        self.token_heads = tuple(env.perception_token_heads)
        merge = cfg.vision.spatial_merge_size
        self.train = split_arrays(env, settings, "train", merge)
        self.val = split_arrays(val_env, settings, "val", merge) if val_env is not None else None
        if self.val is not None and not np.array_equal(self.val.grid, self.train.grid):
            raise ValueError(f"sft.perception: val images have a {tuple(self.val.grid)} patch grid, train images "
                             f"{tuple(self.train.grid)}")
        self.family = family_of(cfg)
        self.layout = jax.tree.map(jnp.asarray, self.family.patch_layout(cfg, [self.train.grid]))
        tokens = self.train.pixels.shape[1] // cfg.vision.merge_unit
        width = cfg.vision.out_hidden_size
        rng = np.random.default_rng(section.seed)
        # the image head's weights are drawn first, as before token heads existed, so image-only runs are unchanged
        self.head = {"w": jnp.asarray(rng.normal(0, 0.02, (tokens * width, sum(self.heads))), jnp.float32),
                     "b": jnp.zeros(sum(self.heads), jnp.float32)}
        if self.token_heads:
            self.head["token_w"] = jnp.asarray(rng.normal(0, 0.02, (width, sum(self.token_heads))), jnp.float32)
            self.head["token_b"] = jnp.zeros(sum(self.token_heads), jnp.float32)
        self.order = np.random.default_rng(section.seed + 1)
        opt = section.optimizer
        schedule = optax.warmup_cosine_decay_schedule(0.0, opt.lr, opt.warmup_steps,
                                                      max(section.steps, opt.warmup_steps + 1),
                                                      opt.lr * opt.end_lr_ratio)
        adam = optax.adamw(schedule, weight_decay=opt.weight_decay) if opt.weight_decay else optax.adam(schedule)
        self.optimizer = optax.chain(optax.clip_by_global_norm(opt.max_grad_norm), adam) if opt.max_grad_norm else adam
        self._step = jax.jit(self._update)
        self._predict = jax.jit(jax.vmap(self._logits, in_axes=(None, 0)))

    def _logits(self, trained: dict, pixels: jax.Array) -> tuple[list[jax.Array], list[jax.Array]]:
        """(the image heads' logits, the token heads' logits (tokens, classes)) of one image."""
        embeds, _ = self.family.encode({"visual": trained["visual"]}, self.cfg, pixels.astype(jnp.float32),
                                       self.layout)
        head = trained["head"]
        image = jnp.split(embeds.reshape(-1) @ head["w"] + head["b"], np.cumsum(self.heads)[:-1]) if self.heads else []
        tokens = (jnp.split(embeds @ head["token_w"] + head["token_b"], np.cumsum(self.token_heads)[:-1], axis=-1)
                  if self.token_heads else [])
        return image, tokens

    def _loss(self, trained: dict, pixels: jax.Array, labels: jax.Array, token_labels: jax.Array) -> jax.Array:
        image, tokens = jax.vmap(self._logits, in_axes=(None, 0))(trained, pixels)
        cross_entropy = optax.softmax_cross_entropy_with_integer_labels
        losses = [cross_entropy(head, labels[:, i]).mean() for i, head in enumerate(image)]
        losses += [cross_entropy(head, token_labels[..., i]).mean() for i, head in enumerate(tokens)]
        return sum(losses) / len(losses)

    def _update(self, trained: dict, state: Any, pixels: jax.Array, labels: jax.Array,
                token_labels: jax.Array) -> tuple:
        loss, grads = jax.value_and_grad(self._loss)(trained, pixels, labels, token_labels)
        updates, state = self.optimizer.update(grads, state, trained)
        return optax.apply_updates(trained, updates), state, loss

    def val_predictions(self, trained: dict) -> tuple[np.ndarray, np.ndarray]:
        """The heads' classes for every val image: (images, image heads) and (images, tokens, token heads)."""
        pixels, size = self.val.pixels, self.section.batch_size
        image, tokens = [], []
        for start in range(0, len(pixels), size):
            image_logits, token_logits = self._predict(trained, jnp.asarray(pixels[start:start + size]))
            image.append(_classes(image_logits, self.val.labels[start:start + size].shape))
            tokens.append(_classes(token_logits, self.val.token_labels[start:start + size].shape))
        return np.concatenate(image), np.concatenate(tokens)

    def evaluate(self, trained: dict) -> dict[str, float]:
        """Share of val labels right, and of val images with every label right (image labels and token labels)."""
        image, tokens = self.val_predictions(trained)
        metrics = {}
        if self.heads:
            correct = image == self.val.labels
            metrics.update({"perception/val_label_accuracy": float(correct.mean()),
                            "perception/val_all_labels": float(correct.all(axis=1).mean())})
        if self.token_heads:
            correct = tokens == self.val.token_labels
            # where few tokens show anything (a few objects in a scene), calling every token empty scores high there
            shown = self.val.token_labels > 0
            metrics.update({"perception/val_token_label_accuracy": float(correct.mean()),
                            "perception/val_shown_token_label_accuracy": float(correct[shown].mean()) if shown.any()
                            else 1.0,
                            "perception/val_all_token_labels": float(correct.all(axis=(1, 2)).mean())})
        return metrics

    def batches(self) -> Any:
        """Batch indices: epochs of a seeded permutation of the train split."""
        count, size = len(self.train.pixels), self.section.batch_size
        queue: list[int] = []
        while True:
            while len(queue) < size:
                queue.extend(self.order.permutation(count).tolist())
            yield np.asarray(queue[:size])
            queue = queue[size:]

    def check_finite(self, step: int, loss: float, trained: dict) -> None:
        """Stop with a NonFiniteError at the first step whose loss or weights hold an inf or a nan (the warm-up
        saves nothing until it ends, so nothing of it is kept)."""
        figure = f"loss is {loss} (non-finite)" if not np.isfinite(loss) else non_finite_params(trained)
        if figure is not None:
            raise NonFiniteError(non_finite_message(f"sft: perception warm-up step {step}", figure,
                                                    "the warm-up keeps no checkpoint before its end",
                                                    "sft.perception"))

    def run(self) -> tuple[Any, dict[str, float]]:
        """Train for section.steps; (params with the warmed tower, the last evaluation or the last loss)."""
        trained = {"visual": self.params["visual"], "head": self.head}
        state = self.optimizer.init(trained)
        train = self.train
        summary: dict[str, float] = {}
        every = self.section.eval_every
        bar = tqdm(total=self.section.steps, desc="perception", unit="step", disable=not self.progress_bar)
        for step, index in zip(range(1, self.section.steps + 1), self.batches()):
            trained, state, loss = self._step(trained, state, jnp.asarray(train.pixels[index]),
                                              jnp.asarray(train.labels[index]), jnp.asarray(train.token_labels[index]))
            metrics = {"perception/loss": float(loss)}
            self.check_finite(step, metrics["perception/loss"], trained)
            if self.val is not None and (step == self.section.steps or every and step % every == 0):
                metrics.update(self.evaluate(trained))
            summary.update(metrics)
            if self.log is not None:
                self.log(step, metrics)
            bar.update(1)
            shown = {"loss": f"{metrics['perception/loss']:.4f}"}
            for name in ("val_all_labels", "val_token_label_accuracy", "val_shown_token_label_accuracy"):
                if f"perception/{name}" in summary:
                    shown[name] = f"{summary[f'perception/{name}']:.3f}"
            bar.set_postfix(shown)
        bar.close()
        params = dict(self.params)
        params["visual"] = trained["visual"]
        return params, summary


def warm_up(policy: Any, params: Any, env: Env, val_env: Env | None, section: SFTParams, folder: Path,
            processes: int = 1, log: Log | None = None) -> tuple[Any, dict[str, float]]:
    """params with the tower warmed by `section.perception`, kept in `folder` so a resumed SFT run skips it."""
    settings = section.perception
    check_supported(section, env, processes)
    done = folder / "perception"
    # Each step's figures, kept beside the checkpoint: a run that skips the warm-up logs them again (a forced rerun
    # starts a new MLflow run, which would otherwise lack them).
    journal = StepJournal(folder / CURVE_DIR).callback(log)
    if (done / SUMMARY_FILE).is_file():  # written last, inside the checkpoint's atomic folder
        _, stored = load_checkpoint(done)
        params = dict(params)
        params["visual"] = stored["visual"]
        journal.replay_through(settings.steps)
        return params, json.loads((done / SUMMARY_FILE).read_text())
    # the env the labels come from: env itself, or the one of its parts that has them (an env made of several)
    source, val_source = env.perception_source(), val_env.perception_source() if val_env is not None else None
    warmup = PerceptionWarmup(policy.cfg, params, policy.processor.settings, source, val_source, settings,
                              log=journal)
    params, summary = warmup.run()
    save_checkpoint(done, policy.cfg, params, hf_config=_stored_config(section.init_dir),
                    extra=lambda tmp: (tmp / SUMMARY_FILE).write_text(json.dumps(summary, sort_keys=True) + "\n"))
    return params, summary


def _stored_config(model_dir: str) -> dict | None:
    """The start model's config.json as written (its transformers fields too), for the warm-up's checkpoint."""
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.exists() else None
