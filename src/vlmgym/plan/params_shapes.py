"""`vlmgym plan --params FILE`: a training step's shapes read from a params file, each with where it came from.

The params hold most of them: the model (model.source, dtype, param_dtype, the tiny model's dimensions), the
stage's mesh, batch (train.batch_prompts x group_size; sft.batch_size), micro-batches, share_prefix, freeze, remat,
LoRA (rank, targets, vision) and answer length (train.max_new_tokens; sft.max_target_tokens). Two come from the
pipeline's own code run on the params:

- the image: the env's raw image (a synthetic world's data.image_height x image_width; for hub data a recorded
  typical size, Env.hub_image_size) through the shard stage's downscale (`prepare_image` under shard.max_pixels)
  and the model processor's resize (`smart_resize`: model.min/max_pixels for the tiny model, the checkpoint's
  preprocessor_config.json or the hub's budget for Qwen3-VL);
- the prompt: the env's first-turn question (`Env.observation`) in the chat template, tokenized as the pipeline
  tokenizes it (`build_inputs`): for the tiny model with the tokenizer the base_model stage trains (the same corpus
  and vocabulary); for Qwen3-VL with the checkpoint's own in model.hf_dir when that folder holds the planned model,
  else from a recorded count (Env.qwen_prompt_text_tokens), marked as an estimate.

Shapes the params cannot give (a question that depends on each sample, hub images of an env without a recorded
size, more than one image or turn per prompt) stop with a DeriveError naming the flag that gives them.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from vlmgym import params as params_mod
from vlmgym.envs import registry
from vlmgym.plan.model_spec import CONFIGS, QWEN2_5

_QWEN_SIZE = re.compile(r"qwen3-vl-(\d+)b", re.IGNORECASE)
_QWEN2_5_SIZE = re.compile(r"qwen2\.5-vl-(\d+)b", re.IGNORECASE)
# Qwen2.5-VL's chat template opens a conversation without a system message with its default one:
# <|im_start|>system\nYou are a helpful assistant.<|im_end|>\n, 11 tokens of the hub tokenizer
QWEN2_5_SYSTEM_TOKENS = 11


class DeriveError(ValueError):
    """A shape the params cannot give; the message names the flag that gives it."""


def load(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Every section of the params files, validated as the stages validate a params file: the first merged over the
    defaults as `vlmgym preset FILE` writes params.yaml (every key's default with the default env's recipe: a full
    params file keeps all its values), each further one on top as `vlmgym preset FILE --on-top` merges it."""
    from vlmgym.cli.presets import defaults

    raw, where = defaults(), "the defaults"
    for path in paths:
        raw = params_mod.merged_params(raw, params_mod.read_yaml(path), where, str(path))
        where = f"{where} + {path}"
    unknown = sorted(set(raw) - set(params_mod.SECTIONS))
    if unknown:
        raise params_mod.ParamsError(f"{where}: unknown section(s) {unknown} "
                                     f"(known: {', '.join(sorted(params_mod.SECTIONS))})")
    # env first: naming a 'package.module:Class' env registers it, and data.<env> is only known after that
    order = ["env", *(name for name in params_mod.SECTIONS if name != "env")]
    sections = {}
    for name in order:
        section = raw.get(name) or {}
        if not isinstance(section, dict):
            raise params_mod.ParamsError(f"{where}: section {name!r} must be a mapping, got {section!r}")
        sections[name] = params_mod.from_dict(params_mod.SECTIONS[name], section, where=f"{where}: {name}")
    return sections


def mesh_of(sections: Mapping[str, Any], algorithm: str | None) -> tuple[int, int, int]:
    """The (data, fsdp, tensor) mesh of the stage planned: sft.mesh for --algorithm sft, else train.mesh."""
    mesh = tuple(sections["sft" if algorithm == "sft" else "train"].mesh)
    if len(mesh) > 3:
        raise DeriveError(f"mesh {list(mesh)}: expected at most (data, fsdp, tensor)")
    return mesh + (1,) * (3 - len(mesh))  # type: ignore[return-value]


def model_config_name(source: str) -> str:
    """The planner's config for a model.source: 'tiny', or the shipped Qwen3-VL or Qwen2.5-VL config its hub name's
    size picks ('4b', 'qwen2.5-3b')."""
    if source == "tiny":
        return "tiny"
    match = _QWEN2_5_SIZE.search(source)
    if source.startswith("hf:") and match is not None and f"{QWEN2_5}{match.group(1)}b" in CONFIGS:
        return f"{QWEN2_5}{match.group(1)}b"
    match = _QWEN_SIZE.search(source)
    if not source.startswith("hf:") or match is None or f"{match.group(1)}b" not in CONFIGS:
        raise DeriveError(f"model.source {source!r}: not a Qwen3-VL or Qwen2.5-VL size the planner ships "
                          f"({', '.join(c for c in CONFIGS if c != 'tiny')}); pass --config")
    return f"{match.group(1)}b"


def derive(sections: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(PlanSpec field values, where each came from, notes on what the plan leaves out) for the params `sections`.

    `given`: the PlanSpec fields set by flags, which win over the params (their source reads '--flag') and which
    the derivation uses in their place: `--config 2b` tokenizes and resizes for 2B, `--image` sets the image whose
    tokens the prompt holds. A shape given by a flag is not derived (an env whose question the params cannot give
    plans with --seq)."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []

    def put(field: str, value: Any, source: str) -> None:
        if field in given:
            values[field], sources[field] = given[field], "--" + field.replace("_", "-")
        else:
            values[field], sources[field] = value, source

    model, train = sections["model"], sections["train"]
    algorithm = given.get("algorithm")
    if algorithm is None:
        algorithm = _algorithm(train, notes)
        values["algorithm"], sources["algorithm"] = algorithm, f"train.algorithm {train.algorithm}"
    else:
        values["algorithm"], sources["algorithm"] = algorithm, "--algorithm"
    sft = algorithm == "sft"
    stage, prefix = (sections["sft"], "sft") if sft else (train, "train")

    if "config" in given:
        put("config", None, "")
    else:
        name = model_config_name(model.source)
        if name == "tiny" and model.tiny_family != "qwen3_vl":
            raise DeriveError(f"model.tiny_family {model.tiny_family}: the planner plans the tiny Qwen3-VL only; pass "
                              f"--config (a shipped model)")
        shipped = ("" if name == "tiny" else f" (the shipped {_shipped_file(name)})")
        put("config", name, f"model.source {model.source}{shipped}")
    put("dtype", model.dtype, "model.dtype")
    put("param_dtype", model.param_dtype, "model.param_dtype")
    put("tiny", (model.tiny_hidden_size, model.tiny_num_layers, model.tiny_vocab_size),
        "model.tiny_hidden_size, tiny_num_layers, tiny_vocab_size")
    put("mesh", mesh_of(sections, algorithm), f"{prefix}.mesh {list(stage.mesh)}")
    if sft:
        put("group", 1, "sft: one answer per prompt")
        put("batch", stage.batch_size, "sft.batch_size")
        put("share_prefix", True, "sft: one answer per prompt")
        put("answer", stage.max_target_tokens, "sft.max_target_tokens")
    else:
        put("group", train.group_size, "train.group_size")
        group_from = "--group" if "group" in given else "train.group_size"
        put("batch", train.batch_prompts * values["group"], f"train.batch_prompts {train.batch_prompts} x {group_from}")
        put("share_prefix", train.share_prefix, "train.share_prefix")
        put("answer", train.max_new_tokens, "train.max_new_tokens")
    put("micro_batches", stage.micro_batches, f"{prefix}.micro_batches")
    put("remat", stage.remat, f"{prefix}.remat")
    put("freeze", stage.freeze, f"{prefix}.freeze")
    put("lora_rank", stage.lora.rank, f"{prefix}.lora.rank")
    put("lora_targets", tuple(stage.lora.targets), f"{prefix}.lora.targets")
    put("lora_vision", stage.lora.vision, f"{prefix}.lora.vision")
    if not sft and train.objective.beta > 0 and not values["lora_rank"]:
        notes.append(f"train.objective.beta {train.objective.beta} holds a reference model (a second copy of the "
                     "params): not counted")

    if "image" in given and "seq" in given:
        put("image", None, "")
        put("seq", None, "")
        return values, sources, notes
    prompt = Prompt(sections, values["config"])
    if "image" in given:
        put("image", None, "")
    else:
        image, how = prompt.image()
        put("image", image, how)
    if "seq" in given:
        put("seq", None, "")
    else:
        text, how = prompt.text_tokens()
        n_image = prompt.image_tokens(values["image"])
        put("seq", text + n_image, f"{n_image} image tokens + {text} text tokens ({how})")
    return values, sources, notes


def _shipped_file(config: str) -> str:
    if config.startswith(QWEN2_5):
        return f"qwen2_5_vl_{config[len(QWEN2_5):]}.json"
    return f"qwen3_vl_{config}.json"


def _family(config: str) -> Any:
    """The Family record of a planner config name."""
    from vlmgym.models.family import QWEN2_5_VL, QWEN3_VL, family_named

    return family_named(QWEN2_5_VL if config.startswith(QWEN2_5) else QWEN3_VL)


def _algorithm(train: Any, notes: list[str]) -> str:
    """The update planned for train.algorithm: grpo's for grpo and rloo (the same update), and for ppo."""
    if train.algorithm == "online_dpo":
        raise DeriveError("train.algorithm online_dpo scores each group's best and worst answer beside a reference "
                          "forward, which the planner does not plan: pass --algorithm grpo or sft to plan those")
    if train.algorithm == "ppo":
        notes.append("train.algorithm ppo: planned as grpo's update; its value head and extra forward not counted")
    return "grpo"


class Prompt:
    """The first-turn prompt of the params' env for the planned model: its image and its tokens."""

    def __init__(self, sections: Mapping[str, Any], config: str):
        self.sections, self.config = sections, config
        self.model, self.env_params = sections["model"], sections["env"]
        self.env_class = registry.env_class(self.env_params.name)
        self.checkpoint, self.checkpoint_note = self._checkpoint()

    def _checkpoint(self) -> tuple[Any, str]:
        """(the Processor of model.hf_dir when that folder holds the planned model, or None; why not)."""
        folder = Path(self.model.hf_dir)
        if self.config == "tiny":  # the tiny tokenizer is trained from the params, not read from a folder
            return None, ""
        if not (folder / "config.json").exists():
            return None, f"no checkpoint in model.hf_dir {folder}"
        from vlmgym.models.family import load_config
        from vlmgym.models.qwen3_vl.processor import Processor

        family = _family(self.config)
        try:
            same = load_config(folder) == family.named_config(self.config.removeprefix(QWEN2_5))
        except ValueError:
            same = False
        if not same:
            return None, f"model.hf_dir {folder} holds another model than {self.config}"
        try:
            return Processor.from_pretrained(folder), ""
        except (OSError, ValueError) as err:
            return None, f"model.hf_dir {folder}: {err}"

    def settings(self) -> tuple[Any, str]:
        """(the processor's ImageSettings, where they came from)."""
        from vlmgym.models.qwen3_vl.processor import ImageSettings

        if self.checkpoint is not None:
            return self.checkpoint.settings, f"{self.model.hf_dir}/preprocessor_config.json"
        if self.config == "tiny":
            return (ImageSettings(min_pixels=self.model.min_pixels, max_pixels=self.model.max_pixels),
                    f"model.min_pixels {self.model.min_pixels}, max_pixels {self.model.max_pixels}")
        family = _family(self.config)
        hub = family.image_settings
        return hub, f"the {family.architecture} hub processor's {hub.min_pixels}-{hub.max_pixels} pixels"

    def _one_image_one_turn(self) -> None:
        cls = self.env_class
        if registry.parts(self.env_params) != [self.env_params.name]:
            raise DeriveError(f"env {cls.name}: its parts' prompts and images differ; pass --image and --seq "
                              "(the largest image, the longest prompt)")
        count = cls.schema.image_count if cls.schema is not None else 1
        if count != 1:
            raise DeriveError(f"env {cls.name} shows {count} images per prompt and the planner plans one; pass "
                              "--image and --seq")

    def image(self) -> tuple[tuple[int, int], str]:
        """((height, width) of each prompt's image as the model sees it, how it was derived)."""
        from vlmgym.models.qwen3_vl.processor import smart_resize

        self._one_image_one_turn()
        data, shard, name = self.sections["data"], self.sections["shard"], self.env_class.name
        if data.source == "synthetic":
            raw, how = (data.image_height, data.image_width), "data.image_height x image_width"
        elif self.env_class.hub_image_size is not None:
            raw, how = self.env_class.hub_image_size, f"data.source hub: {name}'s typical image (Env.hub_image_size)"
        else:
            raise DeriveError(f"env {name} with data.source hub: its images' size is not in the params; pass --image "
                              "(height x width after the processor's resize)")
        sharded = shard_size(raw, shard.max_pixels)
        settings, budget = self.settings()
        resized = smart_resize(*sharded, settings.factor, settings.min_pixels, settings.max_pixels)
        steps = [f"{raw[0]}x{raw[1]} ({how})"]
        if sharded != raw:
            steps.append(f"{sharded[0]}x{sharded[1]} (shard.max_pixels {shard.max_pixels})")
        steps.append(f"{resized[0]}x{resized[1]} ({budget})")
        return resized, " -> ".join(steps)

    def image_tokens(self, image: tuple[int, int]) -> int:
        """Merged image tokens of one image the model sees at (height, width)."""
        factor = self.settings()[0].factor
        return (image[0] // factor) * (image[1] // factor)

    def messages(self) -> list[dict]:
        """The env's first-turn chat messages (Env.observation), the image a placeholder."""
        self._one_image_one_turn()
        cls = self.env_class
        # Env.__init__ reads the env's shards; the first turn's messages need only its settings (Env.observation).
        env = cls.__new__(cls)
        env.params = self.env_params.settings()
        if env.max_turns > 1:
            raise DeriveError(f"env {cls.name} runs up to {env.max_turns} turns, whose later prompts are longer than "
                              "the first: pass --seq (the longest turn's prompt tokens)")
        try:
            return env.observation(SimpleNamespace(key="plan", images=[None], meta={}))["messages"]
        except (KeyError, AttributeError, TypeError, ValueError) as err:
            raise DeriveError(f"env {cls.name}: its question depends on each sample ({type(err).__name__}: {err}); "
                              "pass --seq (the longest prompt's tokens, image included)") from err

    def text_tokens(self) -> tuple[int, str]:
        """(the first-turn prompt's tokens besides its image pads, how they were counted)."""
        messages = self.messages()
        if self.config == "tiny":
            from vlmgym.models.qwen3_vl.processor import Processor

            processor = Processor(tiny_tokenizer(self.env_params, self.model.tiny_vocab_size), self.settings()[0])
            return count_text_tokens(processor, messages), (
                f"tokenized by the tokenizer base_model trains: model.tiny_vocab_size {self.model.tiny_vocab_size}, "
                "the envs' corpus")
        if self.checkpoint is not None:
            return count_text_tokens(self.checkpoint, messages), f"tokenized by {self.model.hf_dir}'s tokenizer"
        recorded = self.env_class.qwen_prompt_text_tokens
        if recorded is not None:
            how = f"an estimate for {self.env_class.name}'s question (Env.qwen_prompt_text_tokens)"
            if self.config.startswith(QWEN2_5) and not any(m.get("role") == "system" for m in messages):
                recorded += QWEN2_5_SYSTEM_TOKENS
                how += f" + {QWEN2_5_SYSTEM_TOKENS} of Qwen2.5-VL's default system prompt"
            return recorded, f"{how}; no tokenizer: {self.checkpoint_note}"
        raise DeriveError(f"the prompt's text tokens need the Qwen3-VL tokenizer ({self.checkpoint_note}): run the "
                          "base_model stage for model.source, or pass --seq (the prompt's tokens, image included)")


def shard_size(image: tuple[int, int], max_pixels: int) -> tuple[int, int]:
    """(height, width) the shard stage writes an image of `image` (height, width) at: its own `prepare_image` run
    on a blank image of that size."""
    from PIL import Image

    from vlmgym.data.image_pool import prepare_image

    buffer = io.BytesIO()
    Image.new("RGB", (image[1], image[0])).save(buffer, format="PNG")
    with Image.open(io.BytesIO(prepare_image(buffer.getvalue(), max_pixels, quality=50))) as out:
        return out.height, out.width


def count_text_tokens(processor: Any, messages: list[dict]) -> int:
    """Tokens of a one-image prompt besides its image pads, as the processor builds it (`build_inputs`)."""
    side = processor.settings.factor
    inputs = processor([messages], [[np.zeros((side, side, 3), np.uint8)]])
    return int(inputs["prompt_lengths"][0] - inputs["image_tokens"][0])


def tiny_tokenizer(env_params: Any, vocab_size: int) -> Any:
    """The tokenizer the base_model stage trains for the tiny model under these env params (stages/base_model.py:
    the envs' corpus, the active env's texts (each part's, for an env of several) and their tools' calls)."""
    from vlmgym.envs.tools import tool_corpus

    texts = registry.corpus(active=registry.parts(env_params))
    for name in registry.parts(env_params):
        tools = tuple(getattr(registry.part_params(env_params, name).settings(), "tools", ()) or ())
        texts += tool_corpus(tools, registry.env_class(name).tool_classes)
    return _trained_tokenizer(tuple(texts), vocab_size)


@functools.lru_cache(maxsize=2)
def _trained_tokenizer(texts: tuple[str, ...], vocab_size: int) -> Any:
    from vlmgym.models.qwen3_vl.base_model import train_tokenizer

    return train_tokenizer(texts, vocab_size)
