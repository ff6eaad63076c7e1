"""LoRA in the trainers: the base never moves, the KL reference is the base inside the trained tree, checkpoints
hold the adapters alone, name their base and resume exactly."""

import jax
import numpy as np
import pytest

from vlmgym.envs.geospot import GeospotEnv
from vlmgym.models.qwen3_vl import lora
from vlmgym.params import LoRAParams, TrainParams, with_values
from vlmgym.rl.grpo_trainer import GRPOTrainer
from vlmgym.rl.policy import Qwen3VLPolicy
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

RANK = lora.LoRAConfig(rank=4, alpha=8.0)


class AnswerLengthEnv(GeospotEnv):
    """A reward a random tiny model already varies on: the answer's length (as in test_qwen_policy)."""

    def score(self, state, text):
        reward, info = super().score(state, text)
        return reward + min(len(text), 40) / 40, info


def _policy(tiny_vlm, max_new_tokens):
    settings = SamplingSettings(max_new_tokens=max_new_tokens, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id))
    return Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings)


def _copy(params):
    return jax.tree.map(jax.numpy.copy, params)  # the trainers donate the params they are given


def _config(**overrides):
    settings = {"steps": 2, "batch_prompts": 2, "group_size": 2, "max_new_tokens": 8, "optimizer.lr": 1e-2,
                "validation.every": 0, "validation.select": "last", "optimizer.warmup_steps": 0,
                "checkpointing.every": 1, "objective.beta": 0.1, "lora": LoRAParams(rank=4, alpha=8.0)}
    return with_values(TrainParams(), {**settings, **overrides})


def _trainer(tiny_vlm, folder, base="base-a", config=None, cls=GRPOTrainer):
    config = config or _config()
    env = AnswerLengthEnv(tiny_vlm.samples, tokenizer=tiny_vlm.processor.tokenizer)
    params = lora.init_adapters(_copy(tiny_vlm.params), tiny_vlm.cfg, lora.LoRAConfig.from_section(config.lora))
    trainer = cls(_policy(tiny_vlm, config.max_new_tokens), env, params, config, folder, progress_bar=False)
    trainer.base_identity = base
    return trainer


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def test_grpo_with_lora_trains_adapters_against_the_base_reference(tiny_vlm, tmp_path):
    trainer = _trainer(tiny_vlm, tmp_path / "run")
    assert trainer.reference_params is None  # no copy of the model is held
    reference = trainer.reference()
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(lora.strip(trainer.params))):
        assert a is b
    assert not lora.has_adapters(reference)
    params = trainer.run()
    assert _bits(lora.strip(params)) == _bits(tiny_vlm.params)  # the base never moved
    assert any(float(np.abs(np.asarray(x["lora_b"])).max()) > 0 for x in _adapter_dicts(params))
    first, second = trainer.history
    assert first["kl_to_reference"] == pytest.approx(0.0, abs=1e-6)  # B = 0: the policy is the base
    assert second["kl_to_reference"] > 0
    assert first["logprob_mismatch_max"] < 1e-4
    # optimizer state: Adam moments of the 2 x 7 adapter matrices only
    adapter_bytes = sum(x.nbytes for x in trainer.optimizer.select(trainer.params))
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(trainer.opt_state))
    assert adapter_bytes * 2 <= state_bytes <= adapter_bytes * 2 + 64


def _adapter_dicts(params):
    return [lora._get(params, path) for path in lora.adapted_paths(params)]


def test_checkpoints_hold_only_the_adapters_and_resume_exactly(tiny_vlm, tmp_path):
    # with adapter dropout: its masks are drawn per (step, iteration, micro-batch), so a resumed run draws the same
    config = _config(lora=LoRAParams(rank=4, alpha=8.0, dropout=0.25))
    whole = _trainer(tiny_vlm, tmp_path / "whole", config=config)
    whole.run()
    without = _trainer(tiny_vlm, tmp_path / "without")  # the same run without dropout trains another model
    without.run()
    assert _bits(whole.params) != _bits(without.params)
    split = _trainer(tiny_vlm, tmp_path / "split", config=config)
    split.run(stop_after=1)
    saved = split.checkpoints.restore(split.checkpoint_params(), split.opt_state)
    names = {getattr(p[-1], "key", None) for p, _ in jax.tree_util.tree_leaves_with_path(saved.params)}
    assert names == {"lora_a", "lora_b"}
    assert sum(x.nbytes for x in jax.tree.leaves(saved.params)) < sum(x.nbytes for x in
                                                                      jax.tree.leaves(tiny_vlm.params)) / 10
    resumed = _trainer(tiny_vlm, tmp_path / "split", config=config)
    resumed.run()
    assert resumed.resumed_from == 1
    assert _bits(resumed.params) == _bits(whole.params)
    assert _bits(resumed.opt_state) == _bits(whole.opt_state)
    for name in ("loss", "reward_mean", "kl_to_reference", "grad_norm"):
        assert resumed.history[-1][name] == whole.history[-1][name], name


def test_resume_on_another_base_is_refused(tiny_vlm, tmp_path):
    _trainer(tiny_vlm, tmp_path / "run", base="base-a").run(stop_after=1)
    with pytest.raises(ValueError, match="another base"):
        _trainer(tiny_vlm, tmp_path / "run", base="base-b").run()


def test_ppo_with_lora_trains_adapters_and_value_head(tiny_vlm, tmp_path):
    from vlmgym.rl.ppo_trainer import PPOTrainer

    config = _config(algorithm="ppo", **{"objective.beta": 0.0, "ppo.kl_coef": 0.05})
    trainer = _trainer(tiny_vlm, tmp_path / "ppo", config=config, cls=PPOTrainer)
    assert trainer.reference_params is None
    params = trainer.run()
    assert _bits(lora.strip(params)) == _bits(tiny_vlm.params)
    assert float(np.abs(np.asarray(trainer.params["value"]["kernel"])).max()) > 0
    assert trainer.history[1]["value_mean"] != 0.0
