"""Run by test_multiturn_trainer.py: its resume test's multi-turn GRPO run in a process of its own, so that
VLMGYM_KILL_IN_WRITE can SIGKILL it inside a checkpoint save.

    python multiturn_kill_worker.py MODEL_DIR PARAMS_NPZ CHECKPOINT_DIR

PARAMS_NPZ holds the start params' leaves as float32 (arr_0, arr_1, ... in jax.tree.leaves order).
"""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: turn_ends, which the test module imports

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from test_multiturn_trainer import resume_trainer, zoom_top_left  # noqa: E402

from vlmgym.envs import multiturn  # noqa: E402
from vlmgym.models.qwen3_vl.config import load_hf_config  # noqa: E402
from vlmgym.models.qwen3_vl.convert import hf_to_params, read_safetensors  # noqa: E402
from vlmgym.models.qwen3_vl.processor import Processor  # noqa: E402

model_dir, params_file, checkpoint_dir = sys.argv[1:]
cfg = load_hf_config(model_dir)
layout = jax.tree.map(jnp.asarray, hf_to_params(read_safetensors(model_dir), cfg))
with np.load(params_file) as saved:
    leaves = [jnp.asarray(saved[f"arr_{i}"], like.dtype) for i, like in enumerate(jax.tree.leaves(layout))]
params = jax.tree.unflatten(jax.tree.structure(layout), leaves)
multiturn.run_tool_call = zoom_top_left
resume_trainer(SimpleNamespace(cfg=cfg, processor=Processor.from_pretrained(model_dir)), params, checkpoint_dir).run()
