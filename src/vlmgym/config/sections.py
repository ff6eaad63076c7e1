"""Typed, validated sections of params.yaml.

Each pipeline stage reads one section into a frozen dataclass. Unknown keys, wrong types and out-of-range values
raise ParamsError naming the key, the value and the file, so a typo in `dvc exp run -S ...` fails loudly instead of
being silently ignored. Imports nothing else of vlmgym: the `env` section, which names an env, lives with the envs
(vlmgym.envs.registry), and vlmgym.params reads the file with every section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlmgym.config.spec import ParamsError, spec, use_canonical_values
from vlmgym.config.subsections import (
    CheckpointParams,
    DPOParams,
    OptimizerParams,
    PPOParams,
    SamplingParams,
    ValidationParams,
)

# --- sections -----------------------------------------------------------------


@dataclass(frozen=True)
class DataParams:
    """download stage: where the env's raw data comes from (its generator's own settings: data.<env name>)."""

    source: str = spec("synthetic", choices=("synthetic", "hub"),
                       doc="the env's embedded generator (offline default) or its public dataset from the hub")
    seed: int = spec(0, ge=0, doc="seed of the synthetic generators")
    train_images: int = spec(2000, ge=1, doc="synthetic train samples")
    test_images: int = spec(1000, ge=1, doc="synthetic test samples")
    ood_images: int = spec(500, ge=0, doc="synthetic out-of-distribution test samples, the test_ood split (a shift "
                                          "the env's generator defines, e.g. fog; 0: no such split)")
    image_width: int = spec(256, ge=32, le=4096, doc="width of rendered synthetic images")
    image_height: int = spec(192, ge=32, le=4096, doc="height of rendered synthetic images")
    hub_repo: str = spec("", doc="hub dataset repo for source=hub (empty: the env's default)")
    zips_per_split: int = spec(1, ge=1, le=98, doc="image zips downloaded per split for source=hub")
    hub_cache_dir: str = spec("data/hub_cache", doc="resumable download cache for source=hub (kept between runs)")
    raw_dir: str = spec("data/raw", doc="where the raw layout is written")
    sections: dict[str, Any] = spec(default_factory=dict, env_sections="DataParams",
                                    doc="each env's generator settings, under its name")


@dataclass(frozen=True)
class ShardParams:
    """shard stage: validation, resizing and webdataset tar writing."""

    max_pixels: int = spec(256 * 192, ge=32 * 32, doc="images larger than this many pixels are downscaled")
    shard_max_bytes: int = spec(64 * 1024 * 1024, ge=1024, doc="target size of one tar")
    jpeg_quality: int = spec(90, ge=1, le=100, doc="JPEG quality of re-encoded images")
    max_train: int = spec(0, ge=0, doc="cap on train samples (0: all)")
    max_test: int = spec(0, ge=0, doc="cap on test samples, and on test_ood samples (0: all)")
    val_samples: int = spec(256, ge=0, doc="train samples held out as the val split for validation during training (at "
                                          "most a quarter of train; 0: none), chosen by a hash of their key")
    rl_samples: int = spec(0, ge=0, doc="train samples held out as the rl split, the prompts the train stage samples "
                                        "(at most half of what val leaves; 0: none, RL samples train's prompts): "
                                        "prompts SFT never read, so RL does not train on answers SFT has fitted")
    workers: int = spec(0, ge=0, doc="processes that decode, resize and re-encode the images (0: the cores this "
                                     "process may use); the output bytes are the same for any count")
    out_dir: str = spec("data/shards", doc="shard output folder")


@dataclass(frozen=True)
class ModelParams:
    """base_model and convert stages."""

    source: str = spec("tiny", doc="'tiny' (random tiny Qwen3-VL built here) or 'hf:<repo>' (hub snapshot)")
    seed: int = spec(0, ge=0, doc="seed of the tiny model's random weights")
    tiny_family: str = spec("qwen3_vl", choices=("qwen3_vl", "qwen2_5_vl"),
                            doc="architecture of the tiny model (a hub snapshot's config.json names its own)")
    tiny_hidden_size: int = spec(128, ge=64, le=4096, doc="tiny text width (multiple of 64; heads and ffn follow)")
    tiny_num_layers: int = spec(4, ge=2, le=64, doc="tiny text decoder layers")
    tiny_vocab_size: int = spec(2048, ge=300, le=65536, doc="BPE vocabulary the tiny tokenizer is trained up to")
    min_pixels: int = spec(64 * 64, ge=32 * 32, doc="tiny image budget: smaller images are upscaled to this")
    max_pixels: int = spec(128 * 96, ge=32 * 32, doc="tiny image budget: 128*96 makes a 256x192 image 12 tokens")
    hf_dir: str = spec("models/hf/base", doc="where base_model writes the HF checkpoint")
    jax_dir: str = spec("models/jax/base", doc="where convert writes the JAX (orbax) checkpoint")
    dtype: str = spec("fp32", choices=("fp32", "bf16"), doc="compute dtype")
    param_dtype: str = spec("fp32", choices=("fp32", "bf16"), doc="parameter dtype")
    parity_tolerance: float = spec(1e-4, gt=0, doc="max abs logit difference accepted by the convert stage (fp32)")


@dataclass(frozen=True)
class TrackingParams:
    """MLflow tracking."""

    experiment: str = spec("vlmgym", doc="MLflow experiment name")
    tracking_uri: str = spec("", doc="empty: MLFLOW_TRACKING_URI if set, else sqlite:///mlflow.db in the repo")
    connect_timeout_s: float = spec(5.0, gt=0, doc="an http(s) tracking server must answer within this many seconds "
                                    "as a stage starts, or the stage stops at once saying so")
    flush_timeout_s: float = spec(30.0, ge=0, doc="as a stage ends, wait this long for the server to take the "
                                  "logs still queued; what it has not taken by then waits in mlflow-spool/ for "
                                  "the next stage or `vlmgym tracking sync`")
    system_metrics: bool = spec(True, doc="log CPU, memory (and GPU where present) on the sft and train runs")


LORA_TEXT_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# PEFT's names for the same projections of Qwen3-VL's decoder (target_modules), and its every-linear shorthand.
PEFT_TARGETS = {**{f"{name}_proj": name for name in LORA_TEXT_TARGETS}, "all-linear": list(LORA_TEXT_TARGETS)}


@dataclass(frozen=True)
class LoRAParams:
    """Low-rank adapters (rank 0: off, every weight trained). Only the adapters are trained and checkpointed."""

    rank: int = spec(0, ge=0, doc="adapter rank r (0: no adapters, full fine-tuning)")
    alpha: float = spec(16.0, gt=0, doc="scale numerator: the update is (alpha / rank) * x A B")
    dropout: float = spec(0.0, ge=0, lt=1,
                          doc="dropout on the adapters' input (PEFT's lora_dropout), in training forwards only")
    targets: list[str] = spec(default_factory=lambda: list(LORA_TEXT_TARGETS), choices=LORA_TEXT_TARGETS,
                              aliases=("target_modules",), value_aliases=PEFT_TARGETS,
                              doc="decoder projections that get adapters (attention q/k/v/o, MLP gate/up/down; "
                                  "PEFT's q_proj ... down_proj and all-linear also read)")
    vision: bool = spec(False, doc="also adapt the vision tower's blocks (qkv, proj, fc1, fc2)")
    seed: int = spec(0, ge=0, doc="seed of the adapters' A (B starts at 0: step 0 is the base model) and dropout")

    def __post_init__(self) -> None:
        use_canonical_values(self)
        if self.rank and not self.targets and not self.vision:
            raise ParamsError("lora.rank > 0 but no targets and vision off: nothing would be adapted")


@dataclass(frozen=True)
class PerceptionParams:
    """A perception warm-up before SFT: the vision tower and a temporary linear head trained on the env's image
    labels (Env.perception_labels), so that SFT starts from a tower that already tells the images apart."""

    steps: int = spec(0, ge=0, doc="warm-up steps (0: none, SFT starts from init_dir's vision tower as it is)")
    batch_size: int = spec(32, ge=1, doc="train images per step")
    optimizer: OptimizerParams = spec(default_factory=lambda: OptimizerParams(lr=3e-3, warmup_steps=100,
                                                                             max_grad_norm=0.0),
                                      doc="of the tower and the head")
    eval_every: int = spec(500, ge=0, doc="label accuracy on the val split every this many steps and at the end "
                                          "(0: at the end only)")
    seed: int = spec(0, ge=0, doc="seed of the head's initial weights and the image order")


REMAT_DOC = ("activation checkpointing of the learner's forward: layer recomputes each decoder layer and vision "
             "block in the backward pass instead of keeping its activations (same gradients, less memory, more "
             "compute; measured in BENCHMARKS.md); none keeps them")


@dataclass(frozen=True)
class SFTParams:
    """sft stage: supervised warm start on the env's ideal answers (0 steps: pass-through)."""

    steps: int = spec(600, ge=0, doc="optimizer steps (0: copy the base model through unchanged)")
    batch_size: int = spec(16, ge=1, doc="samples per step")
    micro_batches: int = spec(1, ge=1, doc="gradient accumulation: micro-batches per step (divides batch_size)")
    optimizer: OptimizerParams = spec(default_factory=lambda: OptimizerParams(lr=3e-3, warmup_steps=20),
                                      doc="AdamW and its schedule")
    freeze: str = spec("none", choices=("none", "vision"), doc="parameters kept frozen")
    remat: str = spec("none", choices=("none", "layer"), doc=REMAT_DOC)
    lora: LoRAParams = spec(default_factory=LoRAParams, doc="low-rank adapters")
    perception: PerceptionParams = spec(default_factory=PerceptionParams,
                                        doc="perception warm-up of the vision tower before the first SFT step")
    max_target_tokens: int = spec(64, ge=1, doc="answer tokens trained on (longer targets are an error)")
    label_noise: float = spec(0.0, ge=0, lt=1, doc="share of train samples taught another train sample's ideal "
                              "answer: a teacher's wrong labels, fixed by each sample's key (0: the ideal answers)")
    seed: int = spec(0, ge=0, doc="seed of the data order")
    validation: ValidationParams = spec(default_factory=ValidationParams, doc="on the val split during training")
    checkpointing: CheckpointParams = spec(default_factory=lambda: CheckpointParams(dir="checkpoints/sft"),
                                           doc="resume points")
    init_dir: str = spec("models/jax/base", doc="model checkpoint to start from")
    out_dir: str = spec("models/jax/sft", doc="where the fine-tuned model is written")
    shards_dir: str = spec("data/shards", doc="webdataset shards of the env")
    mesh: list[int] = spec(default_factory=list, ge=1,
                           doc="(data, fsdp, tensor) device counts of the mesh; empty: a single device")

    def __post_init__(self) -> None:
        if self.perception.steps and not self.steps:
            raise ParamsError("sft.perception.steps > 0 but sft.steps is 0: the warm-up runs inside SFT, and "
                              "sft.steps: 0 passes the start model through unchanged")


# TRL's loss_type values for the aggregations they match (one process: dapo's divisor is the batch's tokens).
TRL_LOSS_TYPES = {"dapo": "token_mean", "grpo": "sequence_mean"}


@dataclass(frozen=True)
class ObjectiveParams:
    """train.objective: the GRPO/RLOO objective's static settings, from the advantages to the loss's reduction (PPO's
    policy loss reads the clip range and the aggregation too). Hashable: the jitted gradient step takes it whole as
    a static argument."""

    epsilon: float = spec(0.2, gt=0, lt=1, doc="lower clip range of the importance ratio")
    epsilon_high: float = spec(0.28, gt=0, doc="upper clip range (clip-higher)")
    beta: float = spec(0.0, ge=0, doc="k3 KL penalty to the initial policy (0: no reference model held)")
    loss_aggregation: str = spec("token_mean", choices=("token_mean", "sequence_mean", "dr_grpo"),
                                 aliases=("loss_type",), value_aliases=TRL_LOSS_TYPES,
                                 doc="how per-token losses are reduced: token_mean (TRL's dapo) over the batch's "
                                     "answer tokens; sequence_mean (TRL's grpo) of each answer's mean; dr_grpo: "
                                     "the sum over rows x max_new_tokens, TRL's constant")
    scale_rewards: str = spec("group", choices=("group", "batch", "none"), doc="advantage std normalisation")
    importance_sampling_level: str = spec(
        "token", choices=("token", "sequence", "sequence_token"),
        doc="the importance ratio the surrogate clips: one per token; sequence (GSPO): one per answer, its "
            "length-normalised log-ratio; sequence_token (GSPO-token): the sequence ratio, each token's own gradient")
    sampler_correction: str = spec(
        "none", choices=("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
        doc="weigh each token's loss by learner / sampler probability at sampling time (needs old_logprobs: "
            "learner): *_truncate clips the weight into [floor, cap] (TIS), *_mask zeroes it outside (MIS); per "
            "token or one per answer (its summed log-ratio); none: off")
    sampler_correction_cap: float = spec(3.0, gt=0, doc="sampler_correction: the weight's upper bound")
    sampler_correction_floor: float = spec(0.0, ge=0, doc="sampler_correction: the weight's lower bound (0: none)")
    mask_truncated_completions: bool = spec(False, doc="an answer that used all max_new_tokens without an EOS carries "
                                            "no loss (its reward still counts in its group's baseline)")
    overlong_buffer: int = spec(0, ge=0, doc="DAPO's soft overlong penalty: over the last this many tokens of "
                                "max_new_tokens the reward falls linearly, by overlong_penalty at the limit (0: off)")
    overlong_penalty: float = spec(1.0, ge=0, doc="overlong_buffer: the penalty at max_new_tokens")
    top_entropy_quantile: float = spec(1.0, ge=0, le=1,
                                       doc="only this top share of answer tokens by entropy carry the policy loss "
                                           "(1: all; 0: the highest only)")

    def __post_init__(self) -> None:
        use_canonical_values(self)


@dataclass(frozen=True)
class TrainParams:
    """train stage: GRPO (or RLOO, PPO, online DPO: `algorithm`) from the sft model."""

    algorithm: str = spec("grpo", choices=("grpo", "rloo", "ppo", "online_dpo"), value_aliases={"dpo": "online_dpo"},
                          doc="grpo; rloo (GRPO's loss with a leave-one-out baseline: each answer against the mean "
                              "of the others in its group); ppo (value head, GAE; the same sampled groups, each "
                              "answer its own episode); or online dpo (each group's best vs worst answer, against "
                              "the start policy)")
    steps: int = spec(150, ge=1, doc="training steps (one batch of prompts each)")
    batch_prompts: int = spec(8, ge=1, doc="prompts per step")
    group_size: int = spec(8, ge=1, aliases=("num_generations",), doc="completions sampled per prompt (the GRPO group)")
    num_iterations: int = spec(1, ge=1, doc="optimizer updates per sampled batch (>1: off-policy, clipped)")
    micro_batches: int = spec(1, ge=1, doc="gradient accumulation: micro-batches per update (divides the batch)")
    share_prefix: bool = spec(True, doc="learner runs each prompt once per group (false: one copy per completion)")
    optimizer: OptimizerParams = spec(default_factory=lambda: OptimizerParams(lr=1e-4, warmup_steps=5),
                                      doc="AdamW and its schedule (which spans steps x num_iterations updates)")
    freeze: str = spec("none", choices=("none", "vision"), doc="parameters kept frozen")
    remat: str = spec("none", choices=("none", "layer"), doc=REMAT_DOC)
    lora: LoRAParams = spec(default_factory=LoRAParams, doc="low-rank adapters")
    objective: ObjectiveParams = spec(default_factory=ObjectiveParams, flat_aliases=True,
                                      doc="the GRPO/RLOO objective: advantages, clip range, KL term, reduction and "
                                          "knobs (each key is also read flat, train.<key>, as older files write it)")
    ppo: PPOParams = spec(default_factory=PPOParams, doc="algorithm ppo's value head and GAE")
    dpo: DPOParams = spec(default_factory=DPOParams, doc="algorithm online_dpo's preference loss")
    filter_groups: bool = spec(False, doc="drop groups whose rewards are all equal and sample more prompts")
    max_sample_rounds: int = spec(4, ge=1, doc="sampling rounds per step when filtering groups")
    old_logprobs: str = spec("sampler", choices=("sampler", "learner"),
                             doc="behaviour log-probs: the sampler's (tempered softmax) or the learner's recomputation")
    filter_metric: str = spec("reward", doc="what filter_groups checks for spread: reward (the total) or a reward "
                              "component the env reports (e.g. a correctness bit)")
    sampling: SamplingParams = spec(default_factory=SamplingParams, doc="the group's answers")
    max_new_tokens: int = spec(64, ge=1, aliases=("max_completion_length",), doc="completion length budget")
    seed: int = spec(0, ge=0, doc="seed of sampling and data order")
    validation: ValidationParams = spec(default_factory=lambda: ValidationParams(every=25, select="best_val"),
                                        doc="on the val split during training")
    checkpointing: CheckpointParams = spec(default_factory=lambda: CheckpointParams(every=20, dir="checkpoints/train"),
                                           doc="resume points")
    samples_every: int = spec(20, ge=1, doc="log a table of sample rollouts every this many steps")
    num_samples: int = spec(8, ge=1, doc="rows of the sample-rollouts table")
    init_dir: str = spec("models/jax/sft", doc="model checkpoint to start from")
    out_dir: str = spec("models/jax/grpo", doc="where the trained model is written")
    shards_dir: str = spec("data/shards", doc="webdataset shards of the env")
    mesh: list[int] = spec(default_factory=list, ge=1,
                           doc="(data, fsdp, tensor) device counts of the mesh; empty: a single device")

    def __post_init__(self) -> None:
        use_canonical_values(self)
        objective = self.objective
        if objective.sampler_correction != "none" and self.old_logprobs != "learner":
            raise ParamsError(f"train.objective.sampler_correction={objective.sampler_correction!r} weighs the "
                              "learner's recomputation against the sampler: set train.old_logprobs: learner")
        if self.group_size < 2 and (self.algorithm in GROUP_ALGORITHMS or self.filter_groups):
            # a lone answer is its group's mean: every advantage (or every DPO pair) would be empty
            need = (f"train.algorithm={self.algorithm!r} compares the answers of a group"
                    if self.algorithm in GROUP_ALGORITHMS else "train.filter_groups keeps groups whose answers differ")
            raise ParamsError(f"train.group_size={self.group_size}: {need}, so it needs train.group_size >= 2")
        if objective.overlong_buffer > self.max_new_tokens:
            raise ParamsError(f"train.objective.overlong_buffer={objective.overlong_buffer} is longer than "
                              f"train.max_new_tokens={self.max_new_tokens}")
        if self.algorithm in ("ppo", "online_dpo"):
            changed = [name for name, default in GRPO_LOSS_DEFAULTS.items() if getattr(objective, name) != default]
            if changed:
                name = changed[0]
                raise ParamsError(f"train.objective.{name} shapes the GRPO/RLOO loss, which train.algorithm="
                                  f"{self.algorithm!r} does not use (leave it at {GRPO_LOSS_DEFAULTS[name]!r})")


# The algorithms whose signal is the spread of rewards inside a group of answers to one prompt (PPO's is not: each
# answer is its own episode against a value head).
GROUP_ALGORITHMS = ("grpo", "rloo", "online_dpo")
# The knobs of the GRPO/RLOO loss and their (off) defaults; the reward and filtering knobs serve every algorithm.
GRPO_LOSS_DEFAULTS = {"importance_sampling_level": "token", "sampler_correction": "none",
                      "mask_truncated_completions": False, "top_entropy_quantile": 1.0}


@dataclass(frozen=True)
class RolloutParams:
    """rollout stage: each policy answers the test split (greedy; optionally sampled too) -> outputs/rollouts/."""

    policies: list[str] = spec(default_factory=lambda: ["base", "sft", "grpo"],
                               doc="policies to roll out, each the JAX model folder models_dir/<policy>")
    models_dir: str = spec("models/jax", doc="folder holding one JAX model folder per policy")
    shards_dir: str = spec("data/shards", doc="webdataset shards of the env")
    split: str = spec("test", choices=("train", "val", "test"), doc="split the policies answer")
    ood_split: str = spec("test_ood", choices=("", "test_ood"),
                          doc="out-of-distribution split also answered (greedy) when the shards hold it ('': none)")
    limit: int = spec(0, ge=0, doc="answer only the first this many samples (0: all)")
    batch_size: int = spec(16, ge=1, doc="prompts per rollout-engine call")
    max_new_tokens: int = spec(64, ge=1, doc="answer length budget (tokens)")
    sampled_answers: int = spec(4, ge=0, doc="sampled answers per prompt written beside the greedy one, reported as "
                                "their mean reward and pass@k (0: none)")
    sampling: SamplingParams = spec(default_factory=SamplingParams, doc="the sampled answers")
    seed: int = spec(0, ge=0, doc="seed of the sampled answers")
    progress: float = spec(1.0, ge=0, le=1, doc="curriculum progress at which answers are scored (1: final reward)")
    constant_baseline: bool = spec(True, doc="also score the image-blind baseline `constant`: the one answer (of the "
                                   "val split's ideal answers) with the best mean val reward, given to every sample")
    constant_candidates: int = spec(128, ge=1, doc="ideal answers of val samples tried as the constant answer")
    blind_policies: list[str] = spec(default_factory=lambda: ["sft", "grpo"],
                                     doc="policies also answering with every image blanked to grey, as "
                                     "<policy>_blind: the text-only baseline (each one of policies; empty: none)")
    out_dir: str = spec("outputs/rollouts", doc="one <policy>.jsonl (and <policy>.sampled.jsonl) per policy")

    def __post_init__(self) -> None:
        unknown = [p for p in self.blind_policies if p not in self.policies]
        if unknown:
            raise ParamsError(f"rollout.blind_policies: {unknown} not among rollout.policies {self.policies}")
        clash = [p for p in self.policies if p == "constant" or p.endswith("_blind")]
        if clash:
            raise ParamsError(f"rollout.policies: {clash} are baseline names (constant, <policy>_blind); "
                              "rename the model folder")


@dataclass(frozen=True)
class ExportParams:
    """export stage: a JAX model folder as a transformers folder."""

    jax_dir: str = spec("models/jax/grpo", doc="JAX model folder exported")
    hf_dir: str = spec("models/hf/grpo", doc="transformers folder written")
    register: bool = spec(True, doc="log it as an MLflow model, registered as vlmgym-<env>")


@dataclass(frozen=True)
class EvalParams:
    """evaluate stage: metrics with bootstrap intervals, the HF baseline, plots and reports."""

    rollouts_dir: str = spec("outputs/rollouts", doc="where the rollout stage wrote <policy>.jsonl")
    comparisons: list[list[str]] = spec(default_factory=lambda: [["grpo", "sft"]],
                                        doc="[treatment, control] pairs reported as paired differences")
    n_resamples: int = spec(1000, ge=10, doc="bootstrap resamples")
    confidence: float = spec(0.95, gt=0, lt=1, doc="confidence level of the intervals")
    seed: int = spec(0, ge=0, doc="seed of the bootstrap")
    gallery_samples: int = spec(48, ge=0, doc="test samples shown in the report's maps and gallery (0: all)")
    hf_policy: str = spec("grpo", doc="policy whose exported weights transformers runs (its greedy rollout compared)")
    hf_dir: str = spec("models/hf/grpo", doc="the exported transformers folder of hf_policy")
    hf_samples: int = spec(16, ge=0, doc="test prompts transformers answers greedily (0: no HF baseline)")
    logit_samples: int = spec(4, ge=0, doc="of those, samples whose prompt + answer logits are compared")
    reward_curve_metric: str = spec("final_reward_mean", doc="train-run metric drawn as the training reward curve "
                                    "(final_reward_mean: at the final curriculum weights; reward_mean: as trained)")

    def __post_init__(self):
        bad = [pair for pair in self.comparisons if len(pair) != 2]
        if bad:
            raise ParamsError(f"eval.comparisons: each must be a [treatment, control] pair, got {bad[0]!r}")
