"""base_model stage: write the base HF checkpoint to models/hf/base/ (params section `model`).

`model.source: tiny` (default) builds a tiny random Qwen3-VL (`model.tiny_family: qwen2_5_vl`: a Qwen2.5-VL) and a
BPE tokenizer trained on the environments' text; `model.source: hf:<owner>/<name>` downloads that hub snapshot
(Qwen3-VL or Qwen2.5-VL). See vlmgym.models.qwen3_vl.base_model for the dimensions.

    python stages/base_model.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import sys

from vlmgym.envs import corpus, env_class, part_params, parts
from vlmgym.envs.tools import tool_corpus
from vlmgym.models.qwen3_vl.base_model import build_base_model
from vlmgym.params import load_section
from vlmgym.runtime.collector import collect_less
from vlmgym.tracking import stage_runs as tracking

# Figures of the built checkpoint logged as metrics (the dimensions go to base_model.json).
FIGURES = ("params_total", "params_vision", "params_text", "vocab_size", "image_tokens_256x192")


def tool_texts(env_params) -> list[str]:
    """With the tools option (vlmgym.envs.multiturn): the calls and replies of the tools the configured env offers
    (a mixture: each sub-env's), so a call is a few tokens. Each env names its tools from its own `tool_classes`,
    so a plug-in's tool is known here as it is in an episode."""
    texts = []
    for name in parts(env_params):
        tools = tuple(getattr(part_params(env_params, name).settings(), "tools", ()) or ())
        texts += tool_corpus(tools, env_class(name).tool_classes)
    return texts


def main(argv: list[str] | None = None) -> int:
    """Build or download the base checkpoint and log one MLflow run with its size and dimensions."""
    collect_less()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="params file (section `model`)")
    args = parser.parse_args(argv)
    params = load_section("model", args.params)
    env_params = load_section("env", args.params)
    env_name = env_params.name
    with tracking.stage_run("base_model", params, extra_params={"env.name": env_name},
                            params_file=args.params) as run:
        # the built-in envs' texts, plus the active env's (a mixture's: each sub-env's) when it is another one
        # (vlmgym.envs.corpus)
        summary = build_base_model(params, corpus=corpus(active=parts(env_params)) + tool_texts(env_params))
        run.log_metrics({k: summary[k] for k in FIGURES if k in summary})
        run.log_dict(summary, "base_model.json")
    print(f"base_model: {summary['source']} -> {params.hf_dir} "
          f"({summary.get('params_total', 'n/a')} parameters)")
    return 0


if __name__ == "__main__":
    from vlmgym.runtime.errors import guarded

    sys.exit(guarded("base_model", main))
