"""AdamW with warmup + cosine decay, global-norm clipping, trainable subsets and fp32 master weights.

Precision choice: parameters may be bf16 (to halve the memory of the forward/backward pass) but the
optimizer always works in fp32. For every trainable bf16 leaf the optimizer state keeps an fp32 master
copy; AdamW updates the master and the bf16 parameter is the master rounded. Without it, small updates
vanish: at lr 5e-7 an Adam step moves a weight of magnitude ~0.02 by ~5e-7, far below half a bf16 ulp
there (~6e-5), so bf16 weights updated in place would never change. Cost for a 4B model: bf16 params
(8 GB) + fp32 master (16 GB) + fp32 Adam moments (32 GB). fp32 parameters need no master copy.

Frozen leaves (e.g. the vision tower) get no optimizer state, no weight decay and no update at all: the
new parameter tree reuses the old leaf, so frozen weights stay bit-identical (even -0.0 stays -0.0,
which `p + 0.0` would not guarantee).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

FREEZE_CHOICES = ("none", "vision")
# Path components that name a vision tower in the model's parameter tree.
VISION_PATTERN = re.compile(r"(^|/)(vision|visual|vision_tower|vision_model)(/|$)")


@dataclass(frozen=True)
class OptimizerConfig:
    """Hyperparameters of the AdamW optimizer and its schedule."""

    learning_rate: float = 1e-5
    warmup_steps: int = 0
    total_steps: int = 1000
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """Linear warmup from 0 to the peak lr, then cosine decay to end_lr_ratio * peak at total_steps."""
    total = max(config.total_steps, config.warmup_steps + 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if config.warmup_steps else config.learning_rate,
        peak_value=config.learning_rate,
        warmup_steps=config.warmup_steps,
        decay_steps=total,
        end_value=config.learning_rate * config.end_lr_ratio,
    )


def path_name(path: tuple) -> str:
    """A pytree key path as 'a/b/0/c'."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def trainable_mask(params: Any, freeze: str = "none") -> Any:
    """A pytree of bools: True for leaves the optimizer updates. freeze='vision' freezes the vision tower."""
    if freeze not in FREEZE_CHOICES:
        raise ValueError(f"freeze={freeze!r}: expected one of {FREEZE_CHOICES}")
    if freeze == "none":
        return jax.tree.map(lambda _: True, params)
    mask = jax.tree_util.tree_map_with_path(lambda path, _: not VISION_PATTERN.search(path_name(path)), params)
    if all(jax.tree.leaves(mask)):
        raise ValueError("freeze='vision' but no parameter path contains a vision component "
                         f"(pattern {VISION_PATTERN.pattern}); nothing would be frozen")
    return mask


class OptimizerState(NamedTuple):
    """Updates applied so far, fp32 master copies (MaskedNode where not needed) and the optax state."""

    step: jax.Array
    master: Any
    inner: Any


class Optimizer:
    """AdamW over the trainable leaves of a parameter tree; `update` is pure and jittable."""

    sparse = False  # gradients are a tree like the params (SubsetOptimizer: a list of the trainable leaves)

    def __init__(self, config: OptimizerConfig, trainable: Any):
        self.config = config
        self.trainable = trainable
        self.schedule = learning_rate_schedule(config)

        def label(is_trainable: bool, leaf: Any) -> str:
            if not is_trainable:
                return "frozen"
            # Biases, norm scales and other vectors are not decayed (the usual AdamW practice).
            return "decay" if jnp.ndim(leaf) >= 2 else "no_decay"

        self._label = label
        adam = dict(b1=config.b1, b2=config.b2, eps=config.eps)
        self._transforms = {
            "decay": optax.adamw(self.schedule, weight_decay=config.weight_decay, **adam),
            "no_decay": optax.adamw(self.schedule, weight_decay=0.0, **adam),
            "frozen": optax.set_to_zero(),
        }

    def _tx(self, params: Any) -> optax.GradientTransformation:
        labels = jax.tree.map(self._label, self.trainable, params)
        parts = [optax.multi_transform(self._transforms, labels)]
        if self.config.max_grad_norm > 0:
            parts.insert(0, optax.clip_by_global_norm(self.config.max_grad_norm))
        return optax.chain(*parts)

    def init(self, params: Any) -> OptimizerState:
        """Optimizer state for `params`: fp32 master copies of trainable non-fp32 leaves, Adam moments."""
        master = jax.tree.map(
            lambda p, t: p.astype(jnp.float32) if t and p.dtype != jnp.float32 else optax.MaskedNode(),
            params, self.trainable)
        inner = self._tx(params).init(self._fp32_view(params, master))
        return OptimizerState(step=jnp.zeros((), jnp.int32), master=master, inner=inner)

    def init_placed(self, params: Any) -> OptimizerState:
        """`init`, jitted, with the state laid out like `params` (see `state_shardings`).

        A plain `jax.jit(init)` leaves outputs that depend on no input value (the zero Adam moments) where XLA
        puts them: on one device, so FSDP-sharded params would get their whole optimizer state on device 0.
        """
        shardings = self.state_shardings(params)
        return jax.jit(self.init)(params) if shardings is None else jax.jit(self.init, out_shardings=shardings)(params)

    def state_shardings(self, params: Any) -> Any:
        """Shardings of `init(params)`: every state leaf that mirrors a parameter (fp32 master copy, Adam moments)
        is placed like that parameter, the rest (step counters) replicated. `params`: arrays or ShapeDtypeStructs
        with shardings. None (jit decides) unless the params sit on one mesh."""
        shardings = [getattr(leaf, "sharding", None) for leaf in jax.tree.leaves(params)]
        meshes = {s.mesh for s in shardings if isinstance(s, NamedSharding)}
        if len(meshes) != 1:
            return None
        mesh = meshes.pop()
        replicated = NamedSharding(mesh, PartitionSpec())
        placed = jax.tree.map(lambda p: p.sharding if isinstance(p.sharding, NamedSharding) and
                              p.sharding.mesh == mesh else replicated, params)
        params_def = jax.tree.structure(params)

        def is_masked(x: Any) -> bool:
            return isinstance(x, optax.MaskedNode)

        def mirrors(x: Any) -> bool:
            return not is_masked(x) and jax.tree.structure(x, is_leaf=is_masked) == params_def

        def place(x: Any) -> Any:
            if mirrors(x):
                return jax.tree.map(lambda m, s: m if is_masked(m) else s, x, placed, is_leaf=is_masked)
            return replicated

        return jax.tree.map(place, jax.eval_shape(self.init, params), is_leaf=mirrors)

    def _fp32_view(self, params: Any, master: Any) -> Any:
        # The fp32 values the optimizer works on: the master where one exists, else the parameter itself.
        return jax.tree.map(lambda p, m: p.astype(jnp.float32) if isinstance(m, optax.MaskedNode) else m,
                            params, master, is_leaf=lambda x: isinstance(x, optax.MaskedNode))

    def stop_frozen_gradients(self, params: Any) -> Any:
        """Params with frozen leaves behind stop_gradient, so the backward pass skips them (e.g. the vision tower)."""
        return jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p), params, self.trainable)

    def update(self, grads: Any, state: OptimizerState, params: Any) -> tuple[Any, OptimizerState, dict]:
        """One AdamW step. Returns new params, new state and {'grad_norm', 'learning_rate', 'update_norm'}."""
        # Frozen gradients are zeroed before anything reads them, so they count in neither the clipping
        # norm nor the reported norm.
        grads = jax.tree.map(lambda g, t: g.astype(jnp.float32) if t else jnp.zeros(g.shape, jnp.float32),
                             grads, self.trainable)
        grad_norm = optax.tree.norm(grads)
        values = self._fp32_view(params, state.master)
        updates, inner = self._tx(params).update(grads, state.inner, values)
        new_values = optax.apply_updates(values, updates)
        new_params = jax.tree.map(lambda p, v, t: v.astype(p.dtype) if t else p, params, new_values, self.trainable)
        new_master = jax.tree.map(
            lambda m, v: m if isinstance(m, optax.MaskedNode) else v,
            state.master, new_values, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
        stats = {
            "grad_norm": grad_norm,
            "learning_rate": self.schedule(state.step),
            "update_norm": optax.tree.norm(updates),
        }
        return new_params, OptimizerState(step=state.step + 1, master=new_master, inner=inner), stats



class SubsetOptimizer:
    """AdamW over only the trainable leaves of a parameter tree (LoRA: the adapters), the rest never touched.

    Unlike `Optimizer` with frozen leaves, the frozen ones appear nowhere: its state, the gradients it takes
    (`select(params)`'s list of trainable leaves, see update.fp32_gradients) and its update hold only the
    trainable leaves, so a frozen 4B base costs no zero gradient buffers, no optimizer state and no copy.
    """

    sparse = True

    def __init__(self, config: OptimizerConfig, trainable: Any):
        self.config, self.trainable = config, trainable
        self._mask = [bool(t) for t in jax.tree.leaves(trainable)]
        if not any(self._mask):
            raise ValueError("SubsetOptimizer: no trainable leaf")
        self._inner = Optimizer(config, [True] * sum(self._mask))
        self.schedule = self._inner.schedule

    def select(self, params: Any) -> list:
        """The trainable leaves of `params`, in tree order (what gradients and the optimizer state are over)."""
        return [p for p, t in zip(jax.tree.leaves(params), self._mask) if t]

    def fill(self, params: Any, selected: list) -> Any:
        """`params` with its trainable leaves replaced by `selected` (the frozen leaves are the same arrays)."""
        leaves, treedef = jax.tree.flatten(params)
        new = iter(selected)
        return jax.tree.unflatten(treedef, [next(new) if t else p for p, t in zip(leaves, self._mask)])

    def init(self, params: Any) -> OptimizerState:
        return self._inner.init(self.select(params))

    def init_placed(self, params: Any) -> OptimizerState:
        return self._inner.init_placed(self.select(params))

    def state_shardings(self, params: Any) -> Any:
        return self._inner.state_shardings(self.select(params))

    def stop_frozen_gradients(self, params: Any) -> Any:
        return jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p), params, self.trainable)

    def update(self, grads: list, state: OptimizerState, params: Any) -> tuple[Any, OptimizerState, dict]:
        """One AdamW step from the trainable leaves' gradients (a list, `select`'s order)."""
        new, state, stats = self._inner.update(grads, state, self.select(params))
        return self.fill(params, new), state, stats

    def trained_tree(self, params: Any) -> Any:
        """Only the trainable leaves, as nested dicts (what a LoRA checkpoint holds: no base weight)."""
        return _prune(params, self.trainable)

    def graft(self, params: Any, trained: Any) -> Any:
        """`params` with the leaves of `trained_tree`'s layout put back."""
        return _graft(params, trained)


def _prune(tree: Any, mask: Any) -> Any:
    if isinstance(tree, dict):
        kept = {k: _prune(tree[k], mask[k]) for k in tree}
        kept = {k: v for k, v in kept.items() if v is not None}
        return kept or None
    return tree if mask is True or (not isinstance(mask, bool) and all(jax.tree.leaves(mask))) else None


def _graft(tree: Any, part: Any) -> Any:
    if isinstance(part, dict):
        return {**tree, **{k: _graft(tree[k], v) for k, v in part.items()}}
    return part
