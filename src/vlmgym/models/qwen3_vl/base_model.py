"""The base HF checkpoint: a tiny random Qwen3-VL with its own tokenizer, or a hub snapshot.

The tiny default is a real `Qwen3VLForConditionalGeneration` (so transformers, the converter and the
parity check treat it like Qwen3-VL-4B), small enough that SFT + GRPO on ~2,000 synthetic 256x192
images fits in minutes on 2 CPU cores. Default dimensions (`TinyDims()`, vocabulary from the
corpus of the environments, trained up to 2,048 tokens):

| part   | setting                                                                        |
|--------|--------------------------------------------------------------------------------|
| text   | hidden 128, 4 layers, 4 query / 2 kv heads, head_dim 32, SwiGLU ffn 384,       |
|        | interleaved MRoPE section [6, 5, 5], rope_theta 10000, tied embeddings         |
| vision | depth 2, hidden 64, 4 heads, ffn 128, patch 16, merge 2, out_hidden 128,       |
|        | DeepStack taps after blocks [0, 1], 64 learned position embeddings (8x8)       |
| image  | pixel budget 4,096..12,288: a 256x192 image becomes 128x96 = 8x6 patches       |
|        | = 12 image tokens                                                              |
| size   | vision 466,624 + text decoder 787,840 + embedding 128 x vocab (tied):          |
|        | 1,254,464 + 128 x vocab; 1,517,376 with the environments' 2,054-token vocab    |
| tokens | default env prompt 62 (12 of them image), five-line answer ~39 (max ~47)       |

rope_theta is 10000 rather than the hub's 5e6: with head_dim 32 and ~100-token sequences a 5e6
base would leave most rotary frequencies unused. `count_parameters` gives the exact figures.

`model.tiny_family: qwen2_5_vl` builds the same dimensions as a Qwen2.5-VL instead
(vlmgym.models.qwen2_5_vl.tiny).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vlmgym.models.qwen3_vl.processor import QWEN3_VL_CHAT_TEMPLATE, ImageSettings, image_processor_config
from vlmgym.runtime.atomic import atomic_dir

# Qwen's special tokens, in the hub tokenizer's order (there they are ids 151643..151656).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
)
# Added but not special in Qwen3 (the chat template writes them for tool use and thinking).
PLAIN_ADDED_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
# The template writes these around every turn; training on them keeps each a single token.
CHAT_SCAFFOLD = ("system\n", "user\n", "assistant\n")
TINY_MIN_PIXELS = 64 * 64
TINY_MAX_PIXELS = 128 * 96
HUB_FILE_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


@dataclass(frozen=True)
class TinyDims:
    """Dimensions of the tiny Qwen3-VL (defaults: the table in the module docstring)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    mrope_section: tuple[int, int, int] = (6, 5, 5)
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    vision_depth: int = 2
    vision_hidden_size: int = 64
    vision_heads: int = 4
    vision_intermediate_size: int = 128
    deepstack_visual_indexes: tuple[int, ...] = (0, 1)
    num_position_embeddings: int = 64
    tie_word_embeddings: bool = True

    @classmethod
    def scaled(cls, hidden_size: int = 128, num_layers: int = 4) -> TinyDims:
        """Defaults with another text width/depth; heads, ffn and vision output follow the width."""
        if hidden_size % 64 or hidden_size <= 0:
            raise ValueError(f"tiny hidden_size must be a positive multiple of 64, got {hidden_size}")
        if num_layers < 2:
            raise ValueError(f"tiny num_layers must be >= 2 (one per DeepStack tap), got {num_layers}")
        heads = hidden_size // 32
        return cls(hidden_size=hidden_size, num_layers=num_layers, num_heads=heads, num_kv_heads=max(1, heads // 2),
                   intermediate_size=3 * hidden_size)

    def validate(self, vocab_size: int) -> None:
        """Raise ValueError on the combinations transformers accepts silently but Qwen3-VL cannot run."""
        problems = []
        if sum(self.mrope_section) != self.head_dim // 2:
            problems.append(f"sum(mrope_section)={sum(self.mrope_section)} != head_dim/2={self.head_dim // 2}")
        if self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if (self.vision_hidden_size // self.vision_heads) % 4 or self.vision_hidden_size % self.vision_heads:
            problems.append("vision head_dim must be an integer divisible by 4")
        if round(self.num_position_embeddings ** 0.5) ** 2 != self.num_position_embeddings:
            problems.append(f"num_position_embeddings {self.num_position_embeddings} is not a perfect square")
        if any(i >= self.vision_depth or i < 0 for i in self.deepstack_visual_indexes):
            problems.append(f"deepstack indexes {self.deepstack_visual_indexes} outside depth {self.vision_depth}")
        if len(self.deepstack_visual_indexes) > self.num_layers:
            problems.append("more DeepStack taps than text layers")
        if vocab_size <= len(SPECIAL_TOKENS):
            problems.append(f"vocab_size {vocab_size} too small")
        if problems:
            raise ValueError("invalid tiny Qwen3-VL dims: " + "; ".join(problems))


def train_tokenizer(corpus: Sequence[str], vocab_size: int = 2048, chat_template: str = QWEN3_VL_CHAT_TEMPLATE) -> Any:
    """A byte-level BPE `Qwen2Tokenizer` trained on `corpus`, with Qwen's special tokens and chat template.

    The pipeline (NFC, Qwen's split regex, byte-level) is exactly what `Qwen2Tokenizer` rebuilds from
    vocab + merges, so the saved folder tokenizes identically however transformers loads it.
    """
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    texts = [t for t in corpus if isinstance(t, str) and t]
    if not texts:
        raise ValueError("tokenizer corpus is empty: the environments provided no text")
    backend = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                            byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # Sorted so the merges do not depend on the order the environments listed their text in.
    backend.train_from_iterator(sorted(set(texts)) + list(CHAT_SCAFFOLD), trainer)
    model = json.loads(backend.to_str())["model"]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]],
                               eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                               extra_special_tokens=list(SPECIAL_TOKENS[1:]), model_max_length=4096,
                               errors="replace", split_special_tokens=False, clean_up_tokenization_spaces=False)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED_TOKENS])
    tokenizer.chat_template = chat_template
    return tokenizer


def tiny_config(tokenizer: Any, dims: TinyDims = TinyDims()) -> Any:
    """An explicit `Qwen3VLConfig` for the tiny model, with token ids taken from `tokenizer`."""
    from transformers import Qwen3VLConfig

    vocab_size = len(tokenizer)
    dims.validate(vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text_config = {
        "vocab_size": vocab_size, "hidden_size": dims.hidden_size, "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_layers, "num_attention_heads": dims.num_heads,
        "num_key_value_heads": dims.num_kv_heads, "head_dim": dims.head_dim, "hidden_act": "silu",
        "max_position_embeddings": dims.max_position_embeddings, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": dims.rope_theta,
                            "mrope_section": list(dims.mrope_section), "mrope_interleaved": True},
        "attention_bias": False, "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    vision_config = {
        "depth": dims.vision_depth, "hidden_size": dims.vision_hidden_size, "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": dims.vision_intermediate_size, "num_heads": dims.vision_heads, "in_channels": 3,
        "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": dims.hidden_size,
        "num_position_embeddings": dims.num_position_embeddings,
        "deepstack_visual_indexes": list(dims.deepstack_visual_indexes),
    }
    return Qwen3VLConfig(text_config=text_config, vision_config=vision_config,
                         image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                         vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                         tie_word_embeddings=dims.tie_word_embeddings)


def count_parameters(model: Any) -> dict[str, int]:
    """Parameter counts of an HF Qwen3-VL or Qwen2.5-VL: total, vision tower, text decoder (embedding included)."""
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for p in model.model.visual.parameters())
    return {"params_total": total, "params_vision": vision, "params_text": total - vision}


def build_tiny(out_dir: str | Path, corpus: Sequence[str], *, seed: int = 0, dims: TinyDims = TinyDims(),
               vocab_size: int = 2048, min_pixels: int = TINY_MIN_PIXELS, max_pixels: int = TINY_MAX_PIXELS,
               family: str = "qwen3_vl") -> dict[str, Any]:
    """Train the tokenizer, build the random tiny model of `family` ('qwen3_vl' or 'qwen2_5_vl') and write an HF
    folder atomically; returns a summary."""
    import dataclasses

    import torch
    from transformers import GenerationConfig

    from vlmgym.models.names import FAMILIES, QWEN2_5_VL

    if family not in FAMILIES:
        raise ValueError(f"tiny model family {family!r} is not one of {FAMILIES}")
    if family == QWEN2_5_VL:
        from transformers import Qwen2_5_VLForConditionalGeneration as model_class

        from vlmgym.models.qwen2_5_vl.processor import CHAT_TEMPLATE, IMAGE_SETTINGS, PROCESSOR_CLASS
        from vlmgym.models.qwen2_5_vl.tiny import tiny_config as qwen2_5_config
        from vlmgym.models.qwen2_5_vl.tiny import tiny_dims_summary

        tokenizer = train_tokenizer(corpus, vocab_size, CHAT_TEMPLATE)
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
        config, processor_class, hub = qwen2_5_config(ids, len(tokenizer), dims), PROCESSOR_CLASS, IMAGE_SETTINGS
        dims_summary = tiny_dims_summary(dims)
    else:
        from transformers import Qwen3VLForConditionalGeneration as model_class

        tokenizer = train_tokenizer(corpus, vocab_size)
        config, processor_class, hub = tiny_config(tokenizer, dims), "Qwen3VLProcessor", ImageSettings()
        dims_summary = asdict(dims)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    endoftext, im_end = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    # The hub's generation defaults, with this tokenizer's ids.
    generation = GenerationConfig(bos_token_id=endoftext, pad_token_id=endoftext, eos_token_id=[im_end, endoftext],
                                  do_sample=True, top_k=20, top_p=0.8, temperature=0.7, repetition_penalty=1.0)
    # the family's patch size, mean and std under the tiny pixel budget
    settings = dataclasses.replace(hub, min_pixels=min_pixels, max_pixels=max_pixels)
    tokens_per_image = settings.num_image_tokens(192, 256)
    preprocessor = image_processor_config(settings, processor_class)

    with atomic_dir(out_dir) as folder:
        model.save_pretrained(folder)
        generation.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    family_field = {} if family == "qwen3_vl" else {"family": family}  # the default's summary as it always was
    return {"source": "tiny", **family_field, "seed": seed, "vocab_size": len(tokenizer), "dims": dims_summary,
            "min_pixels": min_pixels, "max_pixels": max_pixels, "image_tokens_256x192": tokens_per_image,
            **count_parameters(model)}


def download_snapshot(repo: str, local_dir: Path) -> None:
    """The one hub call: fetch the model files of `repo` into `local_dir` (tests replace this)."""
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id=repo, local_dir=str(local_dir), allow_patterns=HUB_FILE_PATTERNS)


def fetch_hub_model(repo: str, out_dir: str | Path,
                    download: Callable[[str, Path], None] = download_snapshot) -> dict[str, Any]:
    """Download a Qwen3-VL hub snapshot into `out_dir` atomically, checking it is a complete checkpoint."""
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"model.source 'hf:{repo}': expected 'hf:<owner>/<name>'")

    with atomic_dir(out_dir) as folder:
        download(repo, folder)
        check_checkpoint(folder, f"hub snapshot of {repo}")
    config = json.loads((Path(out_dir) / "config.json").read_text())
    text = config.get("text_config") or config  # Qwen2.5-VL hub configs keep the text keys at the top level
    return {"source": f"hf:{repo}", "model_type": config.get("model_type"),
            "text_hidden_size": text.get("hidden_size"), "text_layers": text.get("num_hidden_layers"),
            "vision_depth": (config.get("vision_config") or {}).get("depth")}


def check_checkpoint(folder: Path, what: str) -> None:
    """Raise ValueError naming what is missing when `folder` is not a loadable Qwen3-VL or Qwen2.5-VL HF
    checkpoint."""
    missing = [name for name in ("config.json", "preprocessor_config.json") if not (folder / name).exists()]
    if not list(folder.glob("*.safetensors")):
        missing.append("*.safetensors")
    if not ((folder / "tokenizer.json").exists() or (folder / "vocab.json").exists()):
        missing.append("tokenizer.json or vocab.json")
    if missing:
        raise ValueError(f"{what}: missing {', '.join(missing)}")
    from vlmgym.models.names import FAMILIES, model_family

    try:
        config = json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}: config.json is not valid JSON: {err}") from err
    try:
        model_family(config)
    except ValueError as err:
        raise ValueError(f"{what}: config.json model_type is {config.get('model_type')!r}, expected one of "
                         f"{', '.join(repr(f) for f in FAMILIES)}") from err


def build_base_model(params: Any, corpus: Sequence[str] = (),
                     download: Callable[[str, Path], None] = download_snapshot) -> dict[str, Any]:
    """The base_model stage's work for a `model` params section: tiny build or hub snapshot into params.hf_dir.

    `corpus`: the texts the tiny model's tokenizer is trained on (the pipeline passes `vlmgym.envs.corpus()`);
    a hub snapshot brings its own tokenizer and ignores it.
    """
    from vlmgym.config.spec import ParamsError

    if params.source == "tiny":
        if params.min_pixels > params.max_pixels:
            raise ParamsError(f"model.min_pixels {params.min_pixels} > model.max_pixels {params.max_pixels}")
        dims = TinyDims.scaled(params.tiny_hidden_size, params.tiny_num_layers)
        return build_tiny(params.hf_dir, corpus, seed=params.seed, dims=dims, vocab_size=params.tiny_vocab_size,
                          min_pixels=params.min_pixels, max_pixels=params.max_pixels, family=params.tiny_family)
    if params.source.startswith("hf:"):
        return fetch_hub_model(params.source[len("hf:"):], params.hf_dir, download)
    raise ParamsError(f"model.source: {params.source!r} is neither 'tiny' nor 'hf:<owner>/<name>'")
