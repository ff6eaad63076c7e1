"""LoRA adapters that change a model's logits, for the export tests of both model families (test helper)."""

from __future__ import annotations

from typing import Any

import jax

from vlmgym.models.qwen3_vl import lora


def trained_looking_adapters(params: Any, cfg: Any) -> Any:
    """`params` with rank-4 adapters on text and vision whose B matrices are small random values (a fresh adapter's
    B is zero, which would leave the logits unchanged and the export's check vacuous)."""
    params = lora.init_adapters(params, cfg, lora.LoRAConfig(rank=4, alpha=8.0, vision=True))
    key = jax.random.key(3)

    def leaf(path, x):
        if getattr(path[-1], "key", None) != "lora_b":
            return x
        return 0.05 * jax.random.normal(jax.random.fold_in(key, len(jax.tree_util.keystr(path))), x.shape)

    return jax.tree_util.tree_map_with_path(leaf, params)
