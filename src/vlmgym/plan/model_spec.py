"""What one `vlmgym plan` run plans for (no JAX import: the command sets the device count before JAX starts)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlmgym.config.sections import LORA_TEXT_TARGETS

QWEN2_5 = "qwen2.5-"  # the shipped Qwen2.5-VL configs' prefix: qwen2.5-3b, qwen2.5-7b (the others are Qwen3-VL's)
CONFIGS = ("tiny", "2b", "4b", "8b", f"{QWEN2_5}3b", f"{QWEN2_5}7b")
TINY_VOCAB = 2048  # the pipeline's default tiny tokenizer (model.tiny_vocab_size)


@dataclass(frozen=True)
class PlanSpec:
    """One configuration to plan: model, mesh, and the train section's batch shapes."""

    config: str = "tiny"
    mesh: tuple[int, int, int] = (1, 1, 1)  # data, fsdp, tensor
    batch: int = 16  # completions per step (train.batch_prompts x group_size; sft: batch_size)
    seq: int = 62  # prompt tokens, image included (padded up to the engine's length bucket)
    answer: int = 64  # completion tokens (train.max_new_tokens; sft: max_target_tokens)
    group: int = 8  # completions per prompt (train.group_size; 1: sft, or one prompt copy per completion)
    micro_batches: int = 1  # gradient accumulation (train.micro_batches)
    share_prefix: bool = True  # train.share_prefix: the learner runs each prompt once per group (False: per answer)
    image: tuple[int, int] = (96, 128)  # height, width of each prompt's image after the processor's resize
    remat: str = "none"
    algorithm: str = "grpo"  # grpo (rloo runs the same update) or sft
    freeze: str = "none"
    lora_rank: int = 0  # train.lora.rank: adapters on the decoder's q/k/v/o/gate/up/down, only they trained
    lora_targets: tuple[str, ...] = LORA_TEXT_TARGETS  # train.lora.targets: the decoder projections adapted
    lora_vision: bool = False  # train.lora.vision: the vision tower's blocks adapted too
    dtype: str = "fp32"
    param_dtype: str = "fp32"
    tiny: tuple[int, int, int] = (128, 4, TINY_VOCAB)  # the tiny model's width, layers, vocabulary (model.tiny_*)

    @property
    def devices(self) -> int:
        return int(np.prod(self.mesh))

    @property
    def micro_rows(self) -> int:
        return self.batch // self.micro_batches

    def check(self) -> None:
        """Raise ValueError on shapes the trainer would reject."""
        if self.config not in CONFIGS:
            raise ValueError(f"config {self.config!r}: expected one of {CONFIGS}")
        if self.batch % self.group or self.batch % self.micro_batches:
            raise ValueError(f"batch {self.batch} must be whole groups of {self.group} and split into "
                             f"{self.micro_batches} micro-batches")
        if self.group > 1 and self.micro_rows % self.group:
            raise ValueError(f"a micro-batch of {self.micro_rows} rows must hold whole groups of {self.group}")
        if self.algorithm == "sft" and self.group != 1:
            raise ValueError("sft scores one completion per prompt: use --group 1")
        if self.lora_rank < 0 or (self.lora_rank and self.freeze != "none"):
            raise ValueError("--lora-rank must be >= 0, and with LoRA the base is frozen whole (no --freeze)")
        if self.lora_rank and (set(self.lora_targets) - set(LORA_TEXT_TARGETS)
                               or not (self.lora_targets or self.lora_vision)):
            raise ValueError(f"LoRA targets {self.lora_targets} (vision {self.lora_vision}): expected some of "
                             f"{LORA_TEXT_TARGETS} or the vision tower")
        if any(side % self.image_factor for side in self.image):
            raise ValueError(f"image {self.image}: both sides must be multiples of {self.image_factor} (the "
                             "processor's resize)")

    @property
    def image_factor(self) -> int:
        """Image sides are multiples of this: one merged token's pixels (Qwen2.5-VL's patches are 14, not 16)."""
        return 28 if self.config.startswith(QWEN2_5) else 32
