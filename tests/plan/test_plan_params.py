"""`vlmgym plan --params`: the shapes read from a params file against the hand-typed flags BENCHMARKS.md's plans ran
with, flags over params, the image and prompt derived as the pipeline derives them, and the shapes it cannot give."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from vlmgym.plan.cli import build_parser, describe, mesh_devices, parse_args, table

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs" / "qwen3vl_4b_osv5m.yaml")
LORA = str(REPO / "configs" / "qwen3vl_4b_osv5m_lora.yaml")
# The OSV-5M recipe's shapes as BENCHMARKS.md's memory plans typed them ("Memory plan" rows 1-8, "LoRA on one
# 80 GB GPU" rows 1-6): each row's --params command there must plan exactly what its flags did.
TYPED = ["--batch", "128", "--seq", "370", "--answer", "128", "--group", "8", "--micro-batches", "8"]


def _row(config: str, remat: str, *, freeze: str = "vision", lora: bool = False) -> tuple[list[str], list[str]]:
    """(the --params command's arguments after --params RECIPE, the flags the row was run with)"""
    extra = ["--params", LORA] if lora else []
    extra += [] if config == "4b" else ["--config", config]
    extra += [] if remat == ("layer" if lora else "none") else ["--remat", remat]
    extra += [] if freeze == "vision" or lora else ["--freeze", freeze]
    shape = ["--mesh", "1,1,1", "--lora-rank", "16"] if lora else ["--mesh", "1,8,1", "--freeze", freeze]
    return extra, ["--config", config, *TYPED, *shape, "--remat", remat]


ROWS = [*(_row(config, remat) for config in ("2b", "4b", "8b") for remat in ("none", "layer")),
        *(_row("4b", remat, freeze="none") for remat in ("none", "layer")),
        *(_row(config, remat, lora=True) for config in ("4b", "2b", "8b") for remat in ("none", "layer"))]


def write(path: Path, params: dict) -> str:
    path.write_text(yaml.safe_dump(params))
    return str(path)


@pytest.mark.parametrize(("extra", "flags"), ROWS)
def test_recipe_params_plan_the_shapes_its_benchmark_rows_typed(extra, flags):
    spec, args = parse_args(["--params", RECIPE, *extra])
    assert spec == parse_args(flags)[0]
    assert args.shapes_from["batch"] == "train.batch_prompts 16 x train.group_size"
    config_from = "--config" if "--config" in extra else "model.source hf:Qwen/Qwen3-VL-4B-Instruct"
    assert args.shapes_from["config"].startswith(config_from)
    # the prompt: OSV-5M's typical photo at the hub processor's budget, and the question's recorded estimate
    assert args.shapes_from["seq"].startswith("336 image tokens + 34 text tokens (an estimate")
    assert "512x682" in args.shapes_from["image"]


def test_the_printed_plan_shows_each_shape_and_where_it_came_from():
    spec, args = parse_args(["--params", RECIPE])
    text = describe(spec, args.shapes_from, args.notes, args.params)
    assert "train.mesh [1, 8, 1]" in text and "train.freeze" in text and "lora_targets" not in text
    assert mesh_devices(build_parser(), build_parser().parse_args(["--params", RECIPE])) == 8
    program = {"arguments": 1, "live_arguments": 2, "outputs": 3, "aliases": 0, "temporaries": 4, "peak": 9}
    report = {"spec": {**dataclasses.asdict(spec), "image_tokens": 336, "prompt_bucket": 512},
              "programs": {"gradients": program}, "state": {"params": 2}, "peak": {"step": 3 * 2**30}}
    head = table(report).splitlines()[0]
    assert head == ("grpo step of 4b (bf16 params, bf16 compute) on mesh 1x8x1: 128 completions (16 prompts x 8) in 8 "
                    "micro-batches, each prompt once per group; prompt 370 tokens (bucket 512) with a 512x672 image "
                    "(336 tokens), answer 128 tokens; remat none, freeze vision, no LoRA")


def test_a_flag_wins_over_the_params_and_the_derived_prompt_follows_it():
    spec, args = parse_args(["--params", RECIPE, "--mesh", "1,4,1", "--group", "4", "--image", "256x256",
                             "--share-prefix", "--no-share-prefix"])
    assert (spec.mesh, spec.group, spec.batch, spec.image, spec.share_prefix) == ((1, 4, 1), 4, 64, (256, 256), False)
    assert spec.seq == 64 + 34  # 256x256 is 8x8 merged tokens, plus the question's
    assert (args.shapes_from["mesh"], args.shapes_from["image"]) == ("--mesh", "--image")
    assert args.shapes_from["batch"] == "train.batch_prompts 16 x --group"
    spec, args = parse_args(["--params", RECIPE, "--seq", "400", "--remat", "layer", "--param-dtype", "fp32"])
    assert (spec.seq, spec.remat, spec.param_dtype, spec.dtype) == (400, "layer", "fp32", "bf16")
    assert args.shapes_from["seq"] == "--seq" and args.shapes_from["dtype"] == "model.dtype"


def test_an_estimated_prompt_length_plans_what_any_length_in_its_bucket_plans():
    """Why a recorded estimate of the question's tokens suffices: the compiled programs' inputs depend on the
    prompt's length bucket alone (370 and every length up to 512 give the same arrays), not on the count."""
    import jax

    from vlmgym.plan.shapes import learner_micro, rollout_prompts, spec_config

    spec, _ = parse_args(["--params", RECIPE])
    cfg = spec_config(spec)

    def shapes(seq):
        other = dataclasses.replace(spec, seq=seq)
        trees = (learner_micro(cfg, other), rollout_prompts(cfg, other))
        return jax.tree.map(lambda x: (x.shape, str(x.dtype)), trees)

    assert shapes(339) == shapes(370) == shapes(512)
    assert shapes(513) != shapes(370)


def test_tiny_default_params_tokenize_the_question_with_the_tokenizer_base_model_trains(tmp_path):
    """The pipeline's defaults give BENCHMARKS.md's tiny default shapes (62-token prompts: 12 image + 50 text tokens,
    96x128 images); a larger synthetic image is downscaled by the shard stage, then resized by the processor."""
    spec, args = parse_args(["--params", write(tmp_path / "empty.yaml", {})])
    typed = parse_args(["--config", "tiny", "--batch", "64", "--seq", "62", "--answer", "64", "--group", "8"])[0]
    assert spec == typed and "tokenized by the tokenizer base_model trains" in args.shapes_from["seq"]
    big = write(tmp_path / "big.yaml", {"data": {"image_width": 512, "image_height": 384}})
    spec, args = parse_args(["--params", big])
    assert (spec.image, spec.seq) == ((96, 128), 62)
    assert args.shapes_from["image"].startswith(
        "384x512 (data.image_height x image_width) -> 192x256 (shard.max_pixels 49152) -> 96x128")
    budget = write(tmp_path / "budget.yaml", {"model": {"max_pixels": 384 * 288}})
    spec, _ = parse_args(["--params", budget])
    assert (spec.image, spec.seq) == ((192, 256), 50 + 48)


def test_a_checkpoint_in_model_hf_dir_of_the_planned_model_tokenizes_the_prompt(tmp_path):
    """On a machine where the base_model stage fetched the recipe's model, the prompt is counted with its tokenizer
    and its image budget (here a stand-in: the shipped 4B config beside the tiny tokenizer)."""
    from vlmgym.envs.registry import EnvParams
    from vlmgym.models.qwen3_vl.config import CONFIGS_DIR
    from vlmgym.models.qwen3_vl.processor import ImageSettings, image_processor_config
    from vlmgym.plan.params_shapes import tiny_tokenizer

    folder = tmp_path / "hf"
    tiny_tokenizer(EnvParams(), 2048).save_pretrained(folder)
    (folder / "config.json").write_text((CONFIGS_DIR / "qwen3_vl_4b.json").read_text())
    settings = ImageSettings(min_pixels=64 * 64, max_pixels=256 * 256)
    (folder / "preprocessor_config.json").write_text(json.dumps(image_processor_config(settings)))
    params = write(tmp_path / "p.yaml", {"model": {"hf_dir": str(folder)}})
    spec, args = parse_args(["--params", RECIPE, "--params", params])
    assert args.shapes_from["seq"] == f"54 image tokens + 50 text tokens (tokenized by {folder}'s tokenizer)"
    assert spec.image == (192, 288) and spec.seq == 54 + 50  # 512x682 within 256x256 pixels: 6x9 merged tokens
    assert f"{folder}/preprocessor_config.json" in args.shapes_from["image"]
    _, args = parse_args(["--params", RECIPE, "--params", params, "--config", "2b"])  # another model: the estimate
    assert "an estimate" in args.shapes_from["seq"] and "holds another model than 2b" in args.shapes_from["seq"]


def test_a_shape_the_params_cannot_give_stops_naming_its_flag(tmp_path, capsys):
    digits = write(tmp_path / "digits.yaml", {"env": {"name": "digits", "recipe": ""}})
    with pytest.raises(SystemExit):
        parse_args(["--params", digits])
    assert "env digits: its question depends on each sample" in capsys.readouterr().err
    spec, args = parse_args(["--params", digits, "--seq", "70"])
    assert spec.seq == 70 and args.shapes_from["image"] == "192x256 (data.image_height x image_width) -> 96x128 " \
        "(model.min_pixels 4096, max_pixels 12288)"
    dpo = write(tmp_path / "dpo.yaml", {"train": {"algorithm": "online_dpo"}})
    with pytest.raises(SystemExit):
        parse_args(["--params", dpo])
    assert "online_dpo" in capsys.readouterr().err
    assert parse_args(["--params", dpo, "--algorithm", "sft"])[0].algorithm == "sft"
    unknown = write(tmp_path / "unknown.yaml", {"model": {"source": "hf:someone/other-vl"}})
    with pytest.raises(SystemExit):
        parse_args(["--params", unknown])
    assert "pass --config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--config", "4b", "--batch", "8"])
    assert "--seq required (or --params FILE)" in capsys.readouterr().err


def test_sft_plans_the_sft_section():
    spec, args = parse_args(["--params", RECIPE, "--algorithm", "sft"])
    assert (spec.batch, spec.group, spec.answer, spec.mesh, spec.seq) == (16, 1, 128, (1, 1, 1), 370)
    assert (args.shapes_from["batch"], args.shapes_from["mesh"]) == ("sft.batch_size", "sft.mesh []")
