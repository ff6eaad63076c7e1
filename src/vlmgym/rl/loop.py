"""What every training loop shares: the policy interface, a resumable data order, checkpoint resume, progress."""

from __future__ import annotations

import abc
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from vlmgym.rl.checkpoint import CheckpointManager
from vlmgym.rl.optim import Optimizer, SubsetOptimizer
from vlmgym.runtime import distributed

if TYPE_CHECKING:  # for annotations only: importing this module does not load the envs
    from vlmgym.envs.base import Env

# Called with each step's figures. One that also has `replay_through(step)` is called with that after a resume, to
# hand on the figures it kept of the steps before it (vlmgym.tracking.step_curve.JournalCallback).
MetricsCallback = Callable[[int, dict[str, float]], None]
RECENT_METRICS = 10
# The step figures whose non-finite value stops a run (the params themselves are checked too): past them every
# later step only spreads the NaN, and a checkpoint of it would be resumed.
WATCHED_FIGURES = ("loss", "grad_norm")


class NonFiniteError(ValueError):
    """A training step made its loss, gradient norm or params non-finite; the run stopped before saving that
    state (its message names the stage, the step, the figure and the last good checkpoint)."""

    user_error = True  # the stages print its message as one line (vlmgym.runtime.errors)


@jax.jit
def _finite_leaves(tree: Any) -> list[jax.Array]:
    """Whether each floating leaf of `tree` is all finite (one reduction per leaf, outside the training step)."""
    return [jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.inexact)]


def first_non_finite_leaf(tree: Any) -> tuple[str, int, int] | None:
    """(the path of the first floating leaf holding an inf or a nan, how many such leaves, how many floating
    leaves) of a params tree; None when every value is finite."""
    finite = np.asarray(jax.device_get(_finite_leaves(tree)), bool)
    if finite.all():  # every step: the leaves' paths are only spelled out for the error
        return None
    paths = [jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
             if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return paths[int(np.argmin(finite))], int((~finite).sum()), len(paths)


class Samples(NamedTuple):
    """Completions sampled for a batch of prompts, group-contiguous ([num_prompts * group_size, max_new_tokens])."""

    tokens: np.ndarray  # int32 completion tokens (anything after the first EOS is padding)
    mask: np.ndarray  # float32: 1 through the first EOS, 0 after it
    logprobs: np.ndarray  # float32 log-probs of the tokens under the sampler's tempered full softmax
    texts: list[str]  # the decoded completions


class Policy(Protocol):
    """A trainable policy: how the loops sample from it and score tokens under it.

    `build_batch` turns observations and completion tokens into the learner's input pytree: the loops give it one
    observation per row, or one per group of consecutive rows (the completions of one prompt), which a policy may
    exploit by running each prompt once; `logprobs` is pure and jittable and returns
    [batch, max_new_tokens] log-probs of the completion tokens under the tempered softmax the sampler used (0 where
    masked). PPO also needs `feature_size` and `logprobs_and_features(params, batch) -> (logprobs, features
    [batch, max_new_tokens, feature_size])`, the hidden state that predicts each token (a value head's input).
    An env with tools (multi-turn episodes) also needs `sample_episodes` and `greedy_episodes`
    (vlmgym.rl.policy.Qwen3VLPolicy's; vlmgym.rollout.episodes.run_episodes).
    """

    eos_ids: tuple[int, ...]
    max_new_tokens: int

    def sample(self, params: Any, observations: Sequence[dict], group_size: int, rng: jax.Array) -> Samples:
        """Sample group_size completions for each observation."""
        ...

    def greedy(self, params: Any, observations: Sequence[dict]) -> Samples:
        """One greedy completion per observation (validation during training)."""
        ...

    def build_batch(self, observations: Sequence[dict], completion_tokens: np.ndarray,
                    completion_mask: np.ndarray) -> Any:
        """Learner inputs for the completions of the observations (len(completion_tokens) / len(observations) each)."""
        ...

    def logprobs(self, params: Any, batch: Any) -> jax.Array:
        """Log-probs of the batch's completion tokens."""
        ...

    def encode_targets(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Target texts as completion tokens ending in EOS, and their mask, [len(texts), max_new_tokens]."""
        ...


# Per-step figures that measure time (they differ between two runs of the same training; everything else agrees).
TIMING_METRICS = frozenset({"step_time_s", "rollout_time_s", "update_time_s", "data_wait_s", "tokens_per_s",
                            "sample_tokens_per_s", "compile_count"})


class DataOrder:
    """A reproducible, resumable walk over dataset indices: a fresh seeded permutation every epoch."""

    def __init__(self, size: int, seed: int, epoch: int = 0, position: int = 0):
        if size < 1:
            raise ValueError("DataOrder needs a dataset with at least one item")
        self.size, self.seed, self.epoch, self.position = size, seed, epoch, position
        self._order = self._permutation(epoch)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)

    def take(self, count: int) -> list[int]:
        """The next `count` indices, crossing into the next epoch's permutation when this one runs out."""
        out = []
        while len(out) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(int(self._order[self.position]))
            self.position += 1
        return out

    def peek(self, count: int) -> list[int]:
        """The indices the next `take(count)` will return, without moving the cursor."""
        return DataOrder(self.size, self.seed, self.epoch, self.position).take(count)

    def state(self) -> dict:
        """JSON-safe cursor."""
        return {"epoch": self.epoch, "position": self.position}

    @classmethod
    def from_state(cls, size: int, seed: int, state: dict) -> DataOrder:
        """Resume a walk from its cursor."""
        return cls(size, seed, epoch=int(state["epoch"]), position=int(state["position"]))


def score(env: Env, state: Any, tokens: np.ndarray, mask: np.ndarray) -> tuple[float, dict]:
    """Reward and info of one completion: its tokens through the first EOS, nothing after."""
    active = [int(t) for t, m in zip(tokens, mask) if m > 0]
    _, _, reward, _, info = env.step(state, active)
    return float(reward), info


def config_fingerprint(config: Any) -> str:
    """A short hash of a config, naming its checkpoint folder so a changed config never resumes a stale run."""
    raw = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:12]


class CompileCounter:
    """Counts traces of the jitted step functions: a Python side effect runs only when JAX (re)traces."""

    def __init__(self) -> None:
        self.count = 0

    def traced(self, name: str) -> None:
        """Called from inside a function being traced."""
        self.count += 1
        tqdm.write(f"[vlmgym.rl] compiling {name} (compile #{self.count})")


class TrainingLoop(abc.ABC):
    """Resume from the latest checkpoint, run the remaining steps with a progress bar, checkpoint, report."""

    name = "train"
    section = "train"  # the params section (and stage) the loop's settings come from, as its errors name it

    def __init__(self, *, total_steps: int, checkpoint_dir: str | Path, save_every: int, keep: int,
                 metrics_callback: MetricsCallback | None = None, progress_bar: bool = True):
        self.total_steps = total_steps
        self.validator: Any = None  # a vlmgym.rl.validation.Validator, set by the subclass when it validates
        self.final_step: int | None = None  # the step the returned params come from (set by run)
        self.checkpoints = CheckpointManager(checkpoint_dir, save_every=save_every, keep=keep)
        self.metrics_callback = metrics_callback
        self.progress_bar = progress_bar and distributed.is_primary()  # one bar for a run over several processes
        self.compiles = CompileCounter()
        self.history: list[dict[str, float]] = []
        # Metrics of the steps before the resume point (the last RECENT_METRICS of them), so a run resumed at its
        # last step still reports its final figures.
        self.restored_history: list[dict[str, float]] = []
        self.resumed_from: int | None = None
        # With LoRA: an identity of the base folder the adapters sit on (saved with each checkpoint, checked on
        # resume); None without adapters.
        self.base_identity: str | None = None

    # Subclasses set these, and provide the loop state, one step and what closes when the run ends.
    params: Any
    opt_state: Any
    rng: jax.Array
    optimizer: Optimizer | SubsetOptimizer

    @abc.abstractmethod
    def loop_state(self) -> dict:
        """JSON-safe loop state saved with each checkpoint (data cursor etc.)."""

    @abc.abstractmethod
    def load_loop_state(self, state: dict) -> None:
        """Restore what loop_state() saved."""

    @abc.abstractmethod
    def step(self, step: int) -> dict[str, float]:
        """Run training step `step` (0-based) and return its metrics."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the loop holds besides its checkpoints (the data prefetch's thread) when a run ends."""

    def resume(self) -> int:
        """Restore the latest checkpoint that restores (a damaged newer one is reported and removed) if there is
        one; returns the step to continue from."""
        restored = self.checkpoints.restore_latest(self.checkpoint_params(), self.opt_state)
        if restored is None:
            return 0
        latest = restored.step
        self.params, self.opt_state, self.rng = self._with_saved(restored.params), restored.opt_state, restored.rng
        state = dict(restored.loop_state)
        saved_base = state.pop("lora_base", None)
        if saved_base != self.base_identity:
            raise ValueError(f"{self.checkpoints.directory}: its adapters were trained on base {saved_base}, this "
                             f"run starts from base {self.base_identity}; refusing to resume on another base")
        self.restored_history = state.pop("recent_metrics", [])
        validation = state.pop("validation", None)
        if self.validator is not None and validation is not None:
            self.validator.load_state(validation)
        self.load_loop_state(state)
        self.resumed_from = latest
        return latest

    def run(self, stop_after: int | None = None) -> Any:
        """Train to total_steps (or stop after `stop_after` steps, for tests, or early on validation); returns
        the policy params the run ends with: the last ones, or with validation's `select: best_val` the best
        validated."""
        start = self.resume()
        self._replay_restored()
        validator = self.validator
        if validator is not None and validator.stopped_at is not None:
            start = validator.stopped_at  # stopped early before a restart: nothing left to run
        end = self.total_steps if stop_after is None else min(self.total_steps, start + stop_after)
        if validator is not None and validator.stopped_at is not None:
            end = start
        if validator is not None and start == 0 and validator.settings.every > 0:
            # The start policy is a candidate too: best_val can end where it began.
            figures = validator.validate(self.model_params(), 0)
            if self.metrics_callback is not None:
                self.metrics_callback(0, figures)
        bar = tqdm(total=self.total_steps, initial=start, desc=self.name, disable=not self.progress_bar,
                   dynamic_ncols=True)
        done = start
        try:
            for step in range(start, end):
                started = time.perf_counter()
                metrics = self.step(step)
                self.check_finite(step + 1, metrics)  # before anything logs, validates or saves the step
                metrics["step_time_s"] = time.perf_counter() - started
                metrics["compile_count"] = float(self.compiles.count)
                done = step + 1
                validated = validator is not None and validator.due(done, self.total_steps)
                if validated:
                    metrics.update(validator.validate(self.model_params(), done))
                self.history.append(metrics)
                if self.metrics_callback is not None:
                    self.metrics_callback(done, metrics)
                stopping = validator is not None and validator.stopped_at == done
                # A validation step is saved: its best params on disk then always match a checkpoint's state.
                self.checkpoints.save(done, self.checkpoint_params(), self.opt_state, self.rng, self._saved_state(),
                                      force=done == self.total_steps or stopping or validated)
                bar.set_postfix(self.postfix(metrics), refresh=False)
                bar.update(1)
                if stopping:
                    tqdm.write(f"[vlmgym.rl] {self.name}: early stop after step {done}: no better validation in "
                               f"{validator.settings.early_stop_patience} validations (best: step "
                               f"{validator.best_step})")
                    break
        finally:
            bar.close()
            self.checkpoints.close()
            self.close()
        if validator is None:
            self.final_step = done
            return self.model_params()
        selected, self.final_step = validator.selected(self.model_params(), done)
        return selected

    def _saved_state(self) -> dict:
        """The loop state a checkpoint holds: the subclass's, the recent figures, the LoRA base, validation's."""
        state = {**self.loop_state(), "recent_metrics": (self.restored_history + self.history)[-RECENT_METRICS:]}
        if self.base_identity is not None:
            state["lora_base"] = self.base_identity
        if self.validator is not None:
            state["validation"] = self.validator.state()
        return state

    def _replay_restored(self) -> None:
        """After a resume, the restored steps' figures to a metrics callback that keeps them (StepJournal's): the
        stage's new MLflow run then holds every step, even when nothing is left to train."""
        replay = getattr(self.metrics_callback, "replay_through", None)
        if self.resumed_from is not None and replay is not None:
            replay(self.resumed_from)

    def check_finite(self, step: int, metrics: dict[str, float]) -> None:
        """Raise NonFiniteError when step `step` (1-based) left a non-finite loss, gradient norm or param."""
        figure = next((f"{name} is {metrics[name]} (non-finite)" for name in WATCHED_FIGURES
                       if name in metrics and not np.isfinite(metrics[name])), None)
        figure = figure or non_finite_params(self.checkpoint_params())
        if figure is not None:
            raise NonFiniteError(non_finite_message(f"{self.section}: step {step}", figure,
                                                    last_checkpoint(self.checkpoints), self.section))

    def checkpoint_params(self) -> Any:
        """What a checkpoint holds of the params: all of them, or with LoRA only the trained leaves (the base is
        `base_identity`'s folder, read again on resume)."""
        return self.optimizer.trained_tree(self.params) if self.optimizer.sparse else self.params

    def _with_saved(self, saved: Any) -> Any:
        return self.optimizer.graft(self.params, saved) if self.optimizer.sparse else saved

    def model_params(self) -> Any:
        """The policy's params within what the loop trains (PPO also trains a value head beside them)."""
        return self.params

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        """The figures shown next to the progress bar."""
        return {"loss": f"{metrics.get('loss', float('nan')):.4f}"}


def non_finite_params(params: Any) -> str | None:
    """What is wrong with a params tree that holds an inf or a nan, for a NonFiniteError; None when all is finite."""
    bad = first_non_finite_leaf(params)
    return None if bad is None else f"params hold inf or nan ({bad[1]} of {bad[2]} arrays, first {bad[0]})"


def last_checkpoint(checkpoints: CheckpointManager) -> str:
    """Which checkpoint a stopped run keeps, in words."""
    latest = checkpoints.latest_step()
    if latest is None:
        return "no checkpoint was saved before it"
    return f"the last good checkpoint is {_shown(checkpoints.directory / str(latest))}"


def non_finite_message(where: str, figure: str, kept: str, settings: str) -> str:
    """One line: where training went non-finite (`where`: "train: step 3"), what is kept, and what to change in
    the params section `settings`."""
    return (f"{where}: {figure}; stopped without saving it or writing outputs, {kept}; lower "
            f"{settings}.optimizer.lr or set {settings}.optimizer.max_grad_norm > 0 and run the stage again")


def _shown(path: Path) -> str:
    """A path relative to the working directory when it lies under it (shorter in a one-line error)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
