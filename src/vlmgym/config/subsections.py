"""The sub-sections that several params sections share: the optimizer and its schedule, validation during training,
checkpointing, sampling, and the algorithm-specific settings of PPO and online DPO.

A section that holds one of them gives it its own defaults (sft's lr is not train's); keys a params file leaves out
of a sub-section keep the holding section's defaults (vlmgym.config.spec.from_dict).
"""

from __future__ import annotations

from dataclasses import dataclass

from vlmgym.config.spec import ParamsError, spec


@dataclass(frozen=True)
class OptimizerParams:
    """AdamW with linear warmup and cosine decay, global-norm clipping."""

    lr: float = spec(1e-4, gt=0, aliases=("learning_rate",), doc="peak learning rate")
    warmup_steps: int = spec(0, ge=0, doc="linear warmup steps")
    end_lr_ratio: float = spec(0.1, ge=0, le=1, aliases=("min_lr_rate",),
                               doc="final lr of the cosine decay, as a fraction of the peak")
    weight_decay: float = spec(0.0, ge=0, doc="AdamW weight decay (matrices only)")
    max_grad_norm: float = spec(1.0, ge=0, doc="global-norm gradient clipping (0: off)")


@dataclass(frozen=True)
class ValidationParams:
    """Greedy (and sampled) reward on the val split during training, and which params the stage keeps."""

    every: int = spec(100, ge=0, doc="validate on the val split every this many steps and at step 0 (0: never)")
    batch_size: int = spec(16, ge=1, doc="val prompts per sampling call")
    select: str = spec("last", choices=("last", "best_val"),
                       doc="params the stage ends with: the last step's, or the best by greedy val reward")
    early_stop_patience: int = spec(0, ge=0, doc="stop after this many validations without a new best (0: never)")

    def __post_init__(self) -> None:
        if self.every == 0 and (self.select != "last" or self.early_stop_patience):
            raise ParamsError(f"validation.select={self.select!r} / validation.early_stop_patience="
                              f"{self.early_stop_patience} need validation: set validation.every > 0")


@dataclass(frozen=True)
class CheckpointParams:
    """Resumable training checkpoints: a killed run resumes from the last one exactly."""

    every: int = spec(100, ge=1, doc="checkpoint every this many steps (resume point)")
    keep: int = spec(2, ge=1, doc="checkpoints kept on disk")
    dir: str = spec("checkpoints", doc="resumable training checkpoints (one folder per config)")


@dataclass(frozen=True)
class SamplingParams:
    """How answers are sampled: the tempered softmax, optionally cut to the top-k tokens or the top-p mass."""

    temperature: float = spec(1.0, gt=0, doc="sampling temperature")
    top_k: int = spec(0, ge=0, doc="sampling top-k (0: off)")
    top_p: float = spec(1.0, gt=0, le=1, doc="sampling nucleus (1: off)")


@dataclass(frozen=True)
class PPOParams:
    """train.algorithm ppo: the value head and GAE (TRL's PPOConfig names)."""

    critic: str = spec("head", choices=("head", "detached"),
                       doc="linear value head on the policy's last hidden states; detached: its gradient never "
                           "reaches the policy")
    gamma: float = spec(1.0, ge=0, le=1, doc="discount over the answer's tokens")
    lam: float = spec(0.95, ge=0, le=1, doc="GAE lambda")
    vf_coef: float = spec(0.1, ge=0, doc="weight of the value loss in the total loss")
    cliprange_value: float = spec(0.2, gt=0, doc="values move at most this far from the sampled-time value")
    kl_coef: float = spec(0.0, ge=0, doc="per-token KL-to-start penalty in the reward (0: no reference)")


@dataclass(frozen=True)
class DPOParams:
    """train.algorithm online_dpo: each group's best vs worst answer, against the start policy."""

    beta: float = spec(0.1, gt=0, doc="strength of the implicit KL to the start policy (TRL's beta)")
