"""mixture: one policy trained on several envs at once (VLM-R1's and r1_vlm's multi-task runs).

`env.name: mixture` with `env.mixture.envs: {digits: 1.0, message_decoding: 1.0}` (names and positive weights, two
or more, no mixture inside a mixture). Each sub-env keeps its own settings (`env.<name>`) and generator settings
(`data.<name>`), its own data under `data/raw/<name>/` and `data/shards/<name>/`, its own rollouts, metrics and
report section (outputs/rollouts/<name>/, metrics/eval.json under <name>, reports/<name>/).

The train split's index space (`weighted`, the default for split "train") draws by weight, so the trainer's
DataOrder (a seeded permutation of range(len(env)) per epoch) fills each step's batch by weight without knowing of
the mixture. The scheme, exactly:
- size N = the smallest number of slots that gives every sub-env at least one slot per sample it holds:
  max over envs of ceil(len_k x W / w_k) (W the weights' sum), capped at MAX_SLOTS;
- slots per env: n_k = N x w_k / W, rounded by largest remainder so they sum to N (ties: name order); each
  env gets at least one;
- slots are laid out env by env in name order (the mixture's order everywhere: YAML writers sort mappings, so
  the order a file lists them in is not kept); env k's r-th slot is its sample perm_k[r mod len_k], perm_k a
  permutation of its samples seeded by (env.mixture.seed, k).
So every epoch of the DataOrder draws each env exactly n_k times (shares = weights up to rounding), a batch is a
uniform draw of slots (its env counts follow the weights in expectation), and the map is a pure function of the
params and the sub-envs' sizes: a resumed run maps its saved cursor to the same samples. When N is capped, an env
whose n_k is below its size is drawn on a fixed seeded subset of n_k samples.
Other splits (val, test) are the concatenation of the sub-envs' samples, each once, in name order.

States carry the sub-env's name in `meta[PART_KEY]` (so `sft_target(meta)` dispatches) and infos in
`info[PART_KEY]` (so the trainer logs each env's figures: `env/<name>/reward_mean`, see
vlmgym.rl.trainer_parts.part_figures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from vlmgym.config.spec import ParamsError, spec
from vlmgym.envs.base import PART_KEY, Env, SampleLike, State
from vlmgym.envs.registry import EnvParams

NAME = "mixture"
MAX_SLOTS = 1 << 20


def _default_envs() -> dict[str, float]:
    return {"digits": 1.0, "message_decoding": 1.0}


@dataclass(frozen=True)
class MixtureParams:
    """mixture: the sub-envs trained together, each drawn by its weight (their settings: env.<name>)."""

    envs: dict[str, float] = spec(default_factory=_default_envs,
                                  doc="sub-env name -> weight (its share of each step's batch, in expectation): "
                                      "two or more registered envs, positive weights")
    seed: int = spec(0, ge=0, doc="seed of the train split's sample order within each sub-env")

    def __post_init__(self) -> None:
        from vlmgym.envs import registry

        where = "env.mixture.envs"
        if len(self.envs) < 2:
            raise ParamsError(f"{where}: a mixture needs at least 2 envs, got {sorted(self.envs)}")
        for name, weight in self.envs.items():
            if name == NAME:
                raise ParamsError(f"{where}.{name}: a mixture cannot contain a mixture")
            if not registry.is_known(name):
                raise ParamsError(f"{where}.{name}: unknown env (known: {', '.join(registry.names())})")
            if not (math.isfinite(weight) and weight > 0):
                raise ParamsError(f"{where}.{name}: weight must be a positive finite number, got {weight!r}")
            if registry.env_class(name).name == NAME:
                raise ParamsError(f"{where}.{name}: a mixture cannot contain a mixture")


def slot_counts(sizes: Sequence[int], weights: Sequence[float], max_slots: int = MAX_SLOTS) -> list[int]:
    """Slots per env of the weighted index space (module docstring): proportional to the weights, summing to N."""
    total = float(sum(weights))
    slots = max(math.ceil(size * total / weight) for size, weight in zip(sizes, weights))
    slots = max(min(slots, max_slots), len(sizes))
    exact = [slots * w / total for w in weights]
    counts = [max(1, math.floor(x)) for x in exact]
    order = sorted(range(len(exact)), key=lambda k: (-(exact[k] - math.floor(exact[k])), k))
    for k in order[: max(0, slots - sum(counts))]:
        counts[k] += 1
    return counts


def slot_table(sizes: Sequence[int], weights: Sequence[float], seed: int,
               max_slots: int = MAX_SLOTS) -> tuple[np.ndarray, np.ndarray]:
    """(env number, local index) of every slot of the weighted index space (module docstring)."""
    counts = slot_counts(sizes, weights, max_slots)
    parts, local = [], []
    for k, (size, count) in enumerate(zip(sizes, counts)):
        perm = np.random.default_rng([seed, k]).permutation(size)
        parts.append(np.full(count, k, np.int64))
        local.append(perm[np.arange(count) % size])
    return np.concatenate(parts), np.concatenate(local).astype(np.int64)


class MixtureEnv(Env):
    """Several envs behind one index space; every call goes to the sub-env a state or an index belongs to."""

    name = NAME
    Params = MixtureParams

    def __init__(self, parts: dict[str, Env] | None = None, *, params: MixtureParams | None = None,
                 weighted: bool = True, **_: Any):
        """Over `parts` ({name: env}); `weighted`: the weighted train index space, else the
        concatenation. Built from params by MixtureEnv.build (the registry's from_params does)."""
        if not parts:
            raise ValueError("mixture: build it from params (vlmgym.envs.from_params) or pass parts={name: env}")
        self.params = params if params is not None else MixtureParams(envs={n: 1.0 for n in parts})
        missing = sorted(set(self.params.envs) ^ set(parts))
        if missing:
            raise ValueError(f"mixture: parts {sorted(parts)} differ from env.mixture.envs {sorted(self.params.envs)}")
        self.parts = {name: parts[name] for name in sorted(self.params.envs)}
        if multi := [name for name, env in self.parts.items() if env.max_turns > 1]:
            raise ValueError(f"mixture: env {multi[0]!r} has tools (max_turns {self.parts[multi[0]].max_turns}); a "
                             "mixture runs one-turn episodes, so set its tools: [] and max_turns: 1")
        self.names = list(self.parts)
        self.weighted = weighted
        sizes = [len(env) for env in self.parts.values()]
        if weighted:
            self._env, self._local = slot_table(sizes, [self.params.envs[n] for n in self.names], self.params.seed)
        else:
            self._env = np.concatenate([np.full(n, k, np.int64) for k, n in enumerate(sizes)])
            self._local = np.concatenate([np.arange(n, dtype=np.int64) for n in sizes])
        self.tokenizer = next(iter(self.parts.values())).tokenizer
        self.progress = 0.0

    @classmethod
    def build(cls, env_params: EnvParams, *, shards_dir: str, split: str, tokenizer: Any = None,
              limit: int | None = None) -> MixtureEnv:
        """The mixture of env.mixture.envs, each sub-env over `<shards_dir>/<name>/<split>` with its own settings;
        the weighted index space on the train split."""
        from vlmgym.envs.registry import env_class

        params = env_params.sections.get(NAME) or MixtureParams()
        parts = {}
        for name in sorted(params.envs):
            sub = env_class(name)
            settings = env_params.sections.get(sub.name)
            if settings is None and sub.Params is not None:
                settings = sub.Params()
            parts[name] = sub(shards_dir=f"{shards_dir}/{name}", split=split, tokenizer=tokenizer, limit=limit,
                              params=settings)
        return cls(parts, params=params, weighted=split == "train")

    def __len__(self) -> int:
        return len(self._env)

    def locate(self, idx: int) -> tuple[str, int]:
        """(sub-env name, its sample index) of index `idx` (wrapping around)."""
        slot = int(idx) % len(self._env)
        return self.names[int(self._env[slot])], int(self._local[slot])

    def set_progress(self, progress: float) -> None:
        super().set_progress(progress)
        for env in self.parts.values():
            env.set_progress(progress)

    def reset(self, idx: int) -> tuple[State, dict]:
        name, local = self.locate(idx)
        state, obs = self.parts[name].reset(local)
        if PART_KEY in state.meta:
            raise ValueError(f"mixture: env {name!r}'s sample {state.key} has a meta key {PART_KEY!r} of its own")
        return replace(state, idx=int(idx), meta={**state.meta, PART_KEY: name}), obs

    def part_of(self, state_or_meta: Any) -> str:
        """The sub-env name a state (or its meta) belongs to."""
        meta = state_or_meta.meta if isinstance(state_or_meta, State) else state_or_meta
        name = meta.get(PART_KEY) if isinstance(meta, dict) else None
        if name not in self.parts:
            raise ValueError(f"mixture: state has no sub-env of this mixture in meta[{PART_KEY!r}] (got {name!r})")
        return name

    def _inner(self, state: State) -> tuple[str, State]:
        name = self.part_of(state)
        return name, replace(state, meta={k: v for k, v in state.meta.items() if k != PART_KEY})

    def step(self, state: State, action_tokens) -> tuple[State, list, float, bool, dict]:
        name, inner = self._inner(state)
        new, observations, reward, done, info = self.parts[name].step(inner, action_tokens)
        return replace(new, meta=state.meta), observations, reward, done, {**info, PART_KEY: name}

    def step_text(self, state: State, text: str) -> tuple[State, list, float, bool, dict]:
        return self.step(state, text if isinstance(text, str) else "")

    def score(self, state: State, text: str) -> tuple[float, dict]:
        name, inner = self._inner(state)
        reward, info = self.parts[name].score(inner, text)
        return reward, {**info, PART_KEY: name}

    def sft_target(self, meta: dict) -> str:
        name = self.part_of(meta)
        return self.parts[name].sft_target({k: v for k, v in meta.items() if k != PART_KEY})

    def perception_source(self) -> Env | None:
        """The one sub-env with perception labels: sft.perception warms the shared tower up on its train split (its
        images are one size, the warm-up's heads are its labels); the others are learnt by SFT alone. None when no
        sub-env has labels; a ValueError when several have (their heads and image sizes differ)."""
        labelled = {name: source for name, env in self.parts.items() if (source := env.perception_source())}
        if len(labelled) > 1:
            raise ValueError(f"mixture: sub-envs {sorted(labelled)} all have perception labels; sft.perception warms "
                             "the tower up on one env's labels (set sft.perception.steps: 0, or keep one of them)")
        return next(iter(labelled.values()), None)

    def prompt(self, sample: SampleLike) -> str:
        raise TypeError("mixture: a sample's prompt is its sub-env's; use reset(idx), or parts[name].prompt")

    def observation(self, sample: SampleLike) -> dict:
        raise TypeError("mixture: a sample's observation is its sub-env's; use reset(idx), or parts[name]")
