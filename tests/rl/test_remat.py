"""Learner memory: train.remat / sft.remat (every layer checkpointed: the plain gradients), and a frozen vision
tower's backward pass skipped."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from vlmgym.envs.geospot import GeospotEnv
from vlmgym.models.qwen3_vl.model import encode_inputs
from vlmgym.params import ObjectiveParams, ParamsError, SFTParams, TrainParams, from_dict
from vlmgym.rl.loop import CompileCounter
from vlmgym.rl.optim import Optimizer, OptimizerConfig, trainable_mask
from vlmgym.rl.policy import Qwen3VLLearner, Qwen3VLPolicy
from vlmgym.rl.update import grpo_gradients, sft_gradients
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

GROUP = 2
REMAT = "remat2"  # jax.checkpoint's primitive (recomputed in the backward pass)


def _policy(tiny_vlm, remat):
    settings = SamplingSettings(max_new_tokens=8, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id))
    return Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings, remat=remat)


def _observations(tiny_vlm):
    env = GeospotEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    return [env.reset(i)[1] for i in range(2)]


def _sft_update(tiny_vlm, remat, freeze="none"):
    """sft_gradients (one completion per prompt: the per-copy token_logprobs forward) and its arguments."""
    policy = _policy(tiny_vlm, remat)
    tokens, mask = policy.encode_targets(["Country: France", "City: Berlin"])
    micro = {"batch": policy.build_batch(_observations(tiny_vlm), tokens, mask), "mask": mask}
    optimizer = Optimizer(OptimizerConfig(learning_rate=1e-3), trainable_mask(tiny_vlm.params, freeze))
    return partial(sft_gradients, policy=policy, optimizer=optimizer, compiles=CompileCounter()), (
        tiny_vlm.params, micro, jnp.float32(mask.sum()))


def test_layer_remat_gives_the_plain_gradients(tiny_vlm):
    # GRPO on groups of GROUP completions per prompt: the shared-prefix forward (prompt pass, completion pass and
    # vision tower all checkpointed), the vision tower trained too.
    rng = np.random.default_rng(0)
    tokens = rng.integers(20, tiny_vlm.cfg.text.vocab_size, (2 * GROUP, 8)).astype(np.int32)
    mask = np.ones(tokens.shape, np.float32)
    mask[1, 5:] = 0
    objective = ObjectiveParams(epsilon=0.2, epsilon_high=0.28, loss_aggregation="token_mean", beta=0.0)
    optimizer = Optimizer(OptimizerConfig(learning_rate=1e-3), trainable_mask(tiny_vlm.params))
    advantages = rng.standard_normal(len(tokens)).astype(np.float32)
    results = []
    for remat in ("none", "layer"):
        policy = _policy(tiny_vlm, remat)
        micro = {"batch": policy.build_batch(_observations(tiny_vlm), tokens, mask), "mask": mask,
                 "behaviour": np.full(mask.shape, -4.0, np.float32) * mask, "advantages": advantages}
        loss, grads, _ = grpo_gradients(tiny_vlm.params, micro, jnp.float32(mask.sum()), policy=policy,
                                        optimizer=optimizer, objective=objective, compiles=CompileCounter())
        results.append((loss, grads))
    (plain_loss, plain), (remat_loss, remat) = results
    assert float(plain_loss) == pytest.approx(float(remat_loss), abs=1e-6)
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(plain["visual"]))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(plain), jax.tree.leaves(remat)):
        diff = float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
        assert diff <= 1e-6, (jax.tree_util.keystr(path), diff)


def _count(jaxpr, name):
    """Equations of primitive `name` in a jaxpr and every jaxpr nested in it (scan bodies, checkpoints, ...)."""
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == name
        for sub in jaxprs_in_params(eqn.params):
            total += _count(sub, name)
    return total


def test_sft_update_checkpoints_each_layer(tiny_vlm):
    # The per-copy forward SFT runs (traced only: its numerics are token_logprobs', shared with the test above).
    fn, args = _sft_update(tiny_vlm, "layer")
    # the vision tower's scans (one per DeepStack stretch) and the decoder's scan, each body checkpointed
    assert _count(jax.make_jaxpr(fn)(*args).jaxpr, REMAT) >= 2
    fn, args = _sft_update(tiny_vlm, "none")
    assert _count(jax.make_jaxpr(fn)(*args).jaxpr, REMAT) == 0


def test_a_frozen_vision_tower_gets_no_backward_pass(tiny_vlm):
    # freeze=vision stops the gradient inside the differentiated loss, so the vision tower runs forward only.
    dots = {}
    for freeze in ("none", "vision"):
        fn, args = _sft_update(tiny_vlm, "none", freeze)
        dots[freeze] = _count(jax.make_jaxpr(fn)(*args).jaxpr, "dot_general")
    vision = jax.make_jaxpr(lambda p, inputs: encode_inputs(p, tiny_vlm.cfg, inputs))
    vision_forward = _count(vision(tiny_vlm.params, args[1]["batch"]["inputs"]).jaxpr, "dot_general")
    # each vision matmul has two backward matmuls (input and weight gradients), but the patch embedding's input is
    # the pixels: 2 x 19 - 1 fewer on the tiny model (86 -> 49); with the stop_gradient outside, none were.
    assert dots["none"] - dots["vision"] >= 2 * vision_forward - 1


def test_remat_param_is_validated(tiny_vlm):
    assert TrainParams().remat == SFTParams().remat == "none"
    assert from_dict(TrainParams, {"remat": "layer"}, "train").remat == "layer"
    with pytest.raises(ParamsError, match="train.remat"):
        from_dict(TrainParams, {"remat": "full"}, "train")
    with pytest.raises(ParamsError, match="sft.remat"):
        from_dict(SFTParams, {"remat": True}, "sft")
    with pytest.raises(ValueError, match="remat"):
        Qwen3VLLearner(tiny_vlm.cfg, SamplingSettings(), remat="everything")

