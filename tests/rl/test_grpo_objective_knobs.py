"""GSPO, the sampler correction, the entropy mask, the overlong penalty and truncation, each against TRL's formula.

The overlong penalty is checked against TRL's own public function (trl.rewards.get_soft_overlong_punishment); the
rest are TRL's lines as methods of its trainer write them (trl 1.16, trl/trainer/grpo_trainer.py `_compute_loss`,
`_generate_and_score_completions`, `get_high_entropy_mask`), rewritten in torch, and the GSPO-token weight of the
GSPO paper (arXiv 2507.18071, eq. 13): they run on the same inputs as vlmgym's jax code and must give the same
loss, gradient and weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from trl.rewards import get_soft_overlong_punishment

from vlmgym.rl import grpo

B, T, MAX_LEN = 6, 7, 10  # completions shorter than the length budget (dr_grpo's divisor differs from B x T)


@pytest.fixture
def inputs():
    rng = np.random.default_rng(3)
    logprobs = rng.normal(-1.5, 0.6, (B, T)).astype(np.float32)
    old = (logprobs + rng.normal(0, 0.25, (B, T))).astype(np.float32)
    sampler = (old + rng.normal(0, 0.4, (B, T))).astype(np.float32)
    advantages = rng.normal(0, 1, B).astype(np.float32)
    lengths = np.array([7, 3, 5, 1, 6, 4])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
    entropies = rng.uniform(0, 3, (B, T)).astype(np.float32)
    return {"logprobs": logprobs, "old": old, "sampler": sampler, "advantages": advantages, "mask": mask,
            "entropies": entropies}


def trl_loss(per_token_logps, old_per_token_logps, advantages, mask, *, level, loss_type, epsilon_low, epsilon_high,
             max_completion_length, importance_sampling_ratio=None, entropy_mask=None):
    """TRL's GRPO loss (beta 0), as its _compute_loss writes it."""
    advantages = advantages.unsqueeze(1)
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        log_importance_weights = log_ratio
    elif level == "sequence":
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    else:  # sequence_token (GSPO-token): sg[s_i] * pi(y_t) / sg[pi(y_t)]
        seq_level_log_weight = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        seq_level_log_weight = seq_level_log_weight.detach().unsqueeze(-1)
        log_importance_weights = per_token_logps - per_token_logps.detach() + seq_level_log_weight
    coef_1 = torch.exp(log_importance_weights)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if entropy_mask is not None:
        per_token_loss = per_token_loss * entropy_mask
    if importance_sampling_ratio is not None:
        per_token_loss = per_token_loss * importance_sampling_ratio
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dapo":  # one process, one micro-batch: num_items_in_batch = the active tokens
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)  # dr_grpo


def trl_sampler_ratio(old_per_token_logps, sampling_per_token_logps, mask, mode, clip_max, clip_min=None):
    """TRL's vLLM importance-sampling ratio for one mode."""
    per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -np.inf
    invalid = (ratio < min_val) | (ratio > clip_max)
    return ratio.masked_fill(invalid, value=0.0)


def trl_high_entropy_mask(entropies, mask, threshold):
    """TRL's get_high_entropy_mask on one process."""
    local = entropies[mask.bool()].float()
    entropy_threshold = torch.quantile(local, threshold)
    masked_entropies = entropies * mask.float()
    return (masked_entropies >= entropy_threshold) & mask.bool()


AGGREGATION = {"grpo": "sequence_mean", "dapo": "token_mean", "dr_grpo": "dr_grpo"}


def _ours(inputs, level, aggregation, token_weights=None, epsilon=0.2, epsilon_high=0.28):
    def loss(logprobs):
        mask = jnp.asarray(inputs["mask"])
        width = MAX_LEN if aggregation == "dr_grpo" else None  # the engine's arrays are max_new_tokens wide
        if width:  # pad to the budget as the sampler's buffers are: padding is masked
            pad = [(0, 0), (0, width - T)]
            logprobs, mask = jnp.pad(logprobs, pad), jnp.pad(mask, pad)
            old = jnp.pad(jnp.asarray(inputs["old"]), pad)
            weights = None if token_weights is None else jnp.pad(jnp.broadcast_to(token_weights, (B, T)), pad)
        else:
            old, weights = jnp.asarray(inputs["old"]), token_weights
        return grpo.grpo_loss(logprobs, old, jnp.asarray(inputs["advantages"]), mask, epsilon=epsilon,
                              epsilon_high=epsilon_high, aggregation=aggregation, importance_sampling_level=level,
                              token_weights=weights).loss
    return jax.value_and_grad(loss)(jnp.asarray(inputs["logprobs"]))


def _theirs(inputs, level, loss_type, **kwargs):
    logprobs = torch.tensor(inputs["logprobs"], requires_grad=True)
    loss = trl_loss(logprobs, torch.tensor(inputs["old"]), torch.tensor(inputs["advantages"]),
                    torch.tensor(inputs["mask"]), level=level, loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28,
                    max_completion_length=MAX_LEN, **kwargs)
    loss.backward()
    return loss.item(), logprobs.grad.numpy()


@pytest.mark.parametrize("level", ["token", "sequence", "sequence_token"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_importance_sampling_levels_give_trls_loss_and_gradient(inputs, level, loss_type):
    loss, grad = _ours(inputs, level, AGGREGATION[loss_type])
    ref_loss, ref_grad = _theirs(inputs, level, loss_type)
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(grad)[:, :T], ref_grad * inputs["mask"], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(("first_log_ratio", "sequence_clipped"), [(1.0, False), (2.0, True)])
def test_gspo_clips_whole_answers(inputs, first_log_ratio, sequence_clipped):
    # Row 0 (7 tokens, advantage > 0): only its first token is off-policy. Token level clips that token alone; GSPO
    # clips the answer by its mean log-ratio (1/7: inside 1 + 0.28, every token learns; 2/7: beyond, none does).
    case = dict(inputs, advantages=np.ones(B, np.float32))
    case["old"] = inputs["logprobs"].copy()
    case["old"][0, 0] -= first_log_ratio
    _, token_grad = _ours(case, "token", "token_mean")
    _, sequence_grad = _ours(case, "sequence", "token_mean")
    token_grad, sequence_grad = np.asarray(token_grad)[0], np.asarray(sequence_grad)[0]
    assert token_grad[0] == 0 and np.all(token_grad[1:] != 0)
    assert np.all(sequence_grad == 0) if sequence_clipped else np.all(sequence_grad != 0)


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
@pytest.mark.parametrize("clip_min", [None, 0.5])
def test_sampler_correction_weights_are_trls(inputs, mode, clip_min):
    ours = grpo.sampler_correction_weights(jnp.asarray(inputs["old"]), jnp.asarray(inputs["sampler"]),
                                           jnp.asarray(inputs["mask"]), mode, cap=2.0,
                                           floor=0.0 if clip_min is None else clip_min)
    theirs = trl_sampler_ratio(torch.tensor(inputs["old"]), torch.tensor(inputs["sampler"]),
                               torch.tensor(inputs["mask"]), mode, clip_max=2.0, clip_min=clip_min)
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=1e-6)
    if mode.endswith("mask"):  # the inputs do put some weights outside the range
        assert (np.asarray(ours) == 0).any()


def test_sampler_correction_multiplies_the_policy_term_as_trl(inputs):
    weights = grpo.sampler_correction_weights(jnp.asarray(inputs["old"]), jnp.asarray(inputs["sampler"]),
                                              jnp.asarray(inputs["mask"]), "token_truncate", cap=2.0)
    loss, grad = _ours(inputs, "token", "token_mean", token_weights=weights)
    ref_loss, ref_grad = _theirs(inputs, "token", "dapo", importance_sampling_ratio=torch.tensor(np.asarray(weights)))
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref_grad * inputs["mask"], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("quantile", [0.0, 0.2, 0.5, 1.0])
def test_high_entropy_mask_is_trls(inputs, quantile):
    ours = grpo.high_entropy_mask(jnp.asarray(inputs["entropies"]), jnp.asarray(inputs["mask"]), quantile)
    theirs = trl_high_entropy_mask(torch.tensor(inputs["entropies"]), torch.tensor(inputs["mask"]), 1 - quantile)
    np.testing.assert_array_equal(np.asarray(ours) > 0, theirs.numpy())
    active = int(inputs["mask"].sum())
    assert int(np.asarray(ours).sum()) == (1 if quantile == 0 else active if quantile == 1
                                           else pytest.approx(quantile * active, abs=1))


def test_entropy_mask_drops_the_low_entropy_tokens_from_the_loss(inputs):
    keep = grpo.high_entropy_mask(jnp.asarray(inputs["entropies"]), jnp.asarray(inputs["mask"]), 0.2)
    _, grad = _ours(inputs, "token", "token_mean", token_weights=keep)
    ref = trl_high_entropy_mask(torch.tensor(inputs["entropies"]), torch.tensor(inputs["mask"]), 0.8).float()
    ref_loss, ref_grad = _theirs(inputs, "token", "dapo", entropy_mask=ref)
    np.testing.assert_allclose(np.asarray(grad), ref_grad * inputs["mask"], rtol=1e-4, atol=1e-7)
    assert np.all(np.asarray(grad)[np.asarray(keep) == 0] == 0)


@pytest.mark.parametrize("buffer", [0, 1, 4, 10])
def test_soft_overlong_penalty_is_trls(buffer):
    lengths = np.arange(0, 14)
    ours = grpo.soft_overlong_penalty(lengths, MAX_LEN, buffer, factor=1.0)
    theirs = get_soft_overlong_punishment(MAX_LEN, buffer)([[1] * int(n) for n in lengths])
    np.testing.assert_allclose(ours, theirs)
    half = grpo.soft_overlong_penalty(lengths, MAX_LEN, buffer, factor=0.5)
    np.testing.assert_allclose(half, np.multiply(theirs, 0.5))


def test_truncated_rows_are_the_answers_without_an_eos():
    eos = (9, 8)
    tokens = np.array([[1, 2, 9, 0], [1, 2, 3, 4], [8, 0, 0, 0], [1, 1, 1, 1]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert grpo.truncated_rows(tokens, mask, eos).tolist() == [False, True, False, False]
