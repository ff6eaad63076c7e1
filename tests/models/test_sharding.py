"""The same forward / prefill / decode on a 2x2 mesh of fake CPU devices equals the single-device result."""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
from qwen_fixtures import hf_positions, image_prompt, make_batch

from vlmgym.models.qwen3_vl import model as qwen
from vlmgym.models.qwen3_vl.vision import encode_images

# Runs in a fresh interpreter: the fake device count must be set before jax is imported.
CHILD = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from vlmgym.models.qwen3_vl import model as qwen
    from vlmgym.models.checkpoint import load_checkpoint
    from vlmgym.models.qwen3_vl.mesh import (batch_sharding, cache_shardings, logical_sharding, make_mesh,
                                                  param_shardings)
    from vlmgym.models.qwen3_vl.vision import encode_images

    jax_dir, data_path, out_path = sys.argv[1:]
    assert jax.device_count() == 4
    mesh = make_mesh(data=1, fsdp=2, tensor=2)
    P = jax.sharding.PartitionSpec
    # a vocab of 255 does not split over tensor=2: that dimension is replicated, the other still sharded
    assert logical_sharding(("vocab", "embed"), (255, 64), mesh).spec == P(None, "fsdp")
    cfg, _ = load_checkpoint(jax_dir)
    cfg, params = load_checkpoint(jax_dir, shardings=param_shardings(cfg, mesh))
    assert params["text"]["layers"]["gate"]["kernel"].sharding.spec == P(None, "fsdp", "tensor")
    data = dict(np.load(data_path))
    batch = data["input_ids"].shape[0]
    put = lambda x, axis: jax.device_put(jnp.asarray(x), batch_sharding(mesh, x.ndim, axis, batch))
    ids, mask, pos = put(data["input_ids"], 0), put(data["attention_mask"], 0), put(data["position_ids"], 1)
    embeds, deepstack = encode_images(params, cfg, jnp.asarray(data["pixel_values"]), data["grid_thw"].tolist())
    logits = qwen.jit_forward(params, cfg, ids, mask, pos, embeds, deepstack)
    last, cache = qwen.jit_prefill(params, cfg, ids, mask, pos, embeds, deepstack, cache_size=48)
    cache = jax.device_put(cache, cache_shardings(cache, mesh))
    step, cache = qwen.jit_decode_step(params, cfg, put(data["tokens"], 0), cache)
    np.savez(out_path, logits=np.asarray(logits), last=np.asarray(last), step=np.asarray(step))
""")


def test_two_by_two_mesh_equals_single_device(tiny_untied, tmp_path, run_on_cpu_devices):
    tiny = tiny_untied
    rng = np.random.default_rng(11)
    grids = [(1, 4, 4), (1, 2, 4)]
    rows = [image_prompt(rng, grids[:1]), image_prompt(rng, grids[1:], text_before=5)]
    batch = make_batch(rows, grids, seed=11)
    positions = hf_positions(tiny.hf, batch)
    tokens = np.array([5, 9], np.int32)
    np.savez(tmp_path / "in.npz", input_ids=batch["input_ids"].astype(np.int32),
             attention_mask=batch["attention_mask"].astype(np.int32), position_ids=positions.astype(np.int32),
             pixel_values=batch["pixel_values"], grid_thw=batch["grid_thw"], tokens=tokens)
    run_on_cpu_devices(4, ["-c", CHILD, tiny.jax_dir, tmp_path / "in.npz", tmp_path / "out.npz"])
    sharded = np.load(tmp_path / "out.npz")

    embeds, deepstack = encode_images(tiny.params, tiny.cfg, jnp.asarray(batch["pixel_values"]), grids)
    args = (jnp.asarray(batch["input_ids"], jnp.int32), jnp.asarray(batch["attention_mask"], jnp.int32),
            jnp.asarray(positions, jnp.int32), embeds, deepstack)
    logits = np.asarray(qwen.jit_forward(tiny.params, tiny.cfg, *args))
    last, cache = qwen.jit_prefill(tiny.params, tiny.cfg, *args, cache_size=48)
    step, _ = qwen.jit_decode_step(tiny.params, tiny.cfg, jnp.asarray(tokens), cache)
    valid = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(sharded["logits"][valid], logits[valid], atol=1e-5, rtol=0)
    np.testing.assert_allclose(sharded["last"], np.asarray(last), atol=1e-5, rtol=0)
    np.testing.assert_allclose(sharded["step"], np.asarray(step), atol=1e-5, rtol=0)


def test_logical_axes_map_to_the_mesh_as_flax_maps_them():
    """mesh.logical_to_mesh_axes against flax.linen's, on every param of the shipped 4B config, activations, and
    rule sets where axes compete for one mesh axis (the first free rule wins) or a rule replicates."""
    import flax.linen as nn
    import jax

    from vlmgym.models.qwen3_vl.config import named_config
    from vlmgym.models.qwen3_vl.mesh import ShardingRules, logical_to_mesh_axes
    from vlmgym.models.qwen3_vl.weights import param_axes

    rule_sets = [ShardingRules(), ShardingRules(embed=("fsdp", "tensor"), mlp="tensor", vocab=("tensor", "fsdp")),
                 ShardingRules(batch="fsdp", embed="fsdp", q_heads=None, layers="data", vision="tensor")]
    param_names = jax.tree.leaves(param_axes(named_config("4b")), is_leaf=lambda x: isinstance(x, tuple))
    cases = param_names + [("batch", None, None), (None, "batch"), ("batch", "length", "embed"), ("embed", "embed2")]
    assert len(param_names) > 20
    compared = 0
    for rules in rule_sets:
        for axes in cases:
            assert logical_to_mesh_axes(axes, rules.table()) == nn.logical_to_mesh_axes(axes, rules.table()), axes
            compared += 1
    assert compared == len(rule_sets) * len(cases)
    with pytest.raises(ValueError, match="more than once"):
        logical_to_mesh_axes(("embed", "embed"), ShardingRules().table())
