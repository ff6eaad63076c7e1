"""Episodes of several turns: each turn's log-probs are the learner's, later turns see the sampled ids verbatim,
transformers generates the same greedy turns from the same conversation, and episodes end where they must."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import torch
from turn_ends import ending_turns_early

from vlmgym.models.qwen3_vl.chat import TOKEN_IDS, continues_conversation
from vlmgym.models.qwen3_vl.model import jit_token_logprobs
from vlmgym.rollout.engine import RolloutEngine
from vlmgym.rollout.episodes import run_episodes
from vlmgym.rollout.sampling import SamplingSettings

pytestmark = pytest.mark.slow

NEW_TOKENS = 12
GROUP = 3
IM_END_LOGIT = 5.0


@pytest.fixture(scope="module")
def talkative(tiny_model: Any, make_obs) -> Any:
    """The tiny model's params with <|im_end|>'s output row pointed along its mean final hidden state, so turns
    often end early (a random model's are near uniform over the vocabulary) and episodes get a second turn."""
    settings = SamplingSettings(max_new_tokens=NEW_TOKENS, eos_ids=tiny_model.eos_ids, pad_id=tiny_model.pad_id)
    probe = RolloutEngine(tiny_model.cfg, tiny_model.processor, settings).generate(
        tiny_model.params, [make_obs(0)], 8, jax.random.key(1))
    return ending_turns_early(tiny_model.params, tiny_model.cfg, probe, tiny_model.eos_ids[0], IM_END_LOGIT)


def engine(model: Any, **settings) -> RolloutEngine:
    base = dict(max_new_tokens=NEW_TOKENS, eos_ids=model.eos_ids, pad_id=model.pad_id)
    return RolloutEngine(model.cfg, model.processor, SamplingSettings(**{**base, **settings}))


def zoom_advance(model: Any, observations: list[dict], group_size: int, max_turns: int):
    """A tool env in miniature: every turn that can continue gets a crop of the first image back, until the last
    turn; returns (advance, the turns each episode was advanced through)."""
    seen: dict[int, tuple[dict, int]] = {}

    def advance(episode: int, text: str, ids: list[int], finish: str) -> dict | None:
        obs, turn = seen.get(episode, (observations[episode // group_size], 0))
        if turn + 1 >= max_turns or not continues_conversation(model.processor.tokenizer, ids):
            return None
        crop = obs["images"][0].crop((0, 0, 32, 32)).resize(obs["images"][0].size)
        reply = {"images": [*obs["images"], crop],
                 "messages": [*obs["messages"], {"role": "assistant", "content": text, TOKEN_IDS: ids},
                              {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "a crop"}]}]}
        seen[episode] = (reply, turn + 1)
        return reply

    return advance


@pytest.fixture(scope="module")
def episodes(tiny_model: Any, make_obs, talkative):
    observations = [make_obs(0), make_obs(1, num_images=2)]
    advance = zoom_advance(tiny_model, observations, GROUP, max_turns=3)
    sampler = engine(tiny_model, temperature=1.0)
    return observations, run_episodes(sampler, talkative, observations, GROUP, jax.random.key(3), advance, 3)


def test_later_turns_happen_and_the_first_turn_is_a_plain_rollout(tiny_model: Any, talkative, episodes):
    observations, batch = episodes
    assert len(batch.turns) >= 2 and len(batch.episodes[1]) >= 1, "no episode reached a second turn"
    assert batch.turn_counts.max() <= 3 and batch.turn_counts.min() >= 1
    plain = engine(tiny_model, temperature=1.0).generate(talkative, observations, GROUP, jax.random.key(3))
    np.testing.assert_array_equal(batch.turns[0].completion_ids, plain.completion_ids)
    episode = int(batch.episodes[1][0])
    assert batch.texts(episode)[:2] == [batch.turns[0].texts[episode], batch.turns[1].texts[0]]


def test_every_turns_logprobs_equal_the_learners(tiny_model: Any, talkative, episodes):
    _, batch = episodes
    for turn in batch.turns:
        inputs = jax.tree.map(jax.numpy.asarray, turn.sequence_inputs())
        recomputed = jit_token_logprobs(talkative, tiny_model.cfg, inputs, turn.completion_ids, turn.completion_mask)
        np.testing.assert_allclose(np.asarray(recomputed), turn.logprobs, atol=1e-5, rtol=0)


def test_a_later_turn_sees_the_earlier_prompt_and_the_sampled_ids_verbatim(episodes):
    _, batch = episodes
    first, second = batch.turns[0], batch.turns[1]
    for row, episode in enumerate(batch.episodes[1]):
        before = first.prompt_inputs["input_ids"][episode // GROUP]
        before = before[first.prompt_inputs["attention_mask"][episode // GROUP] == 1].tolist()
        sampled = first.completion_ids[episode, :first.lengths[episode]].tolist()
        now = second.prompt_inputs["input_ids"][row][second.prompt_inputs["attention_mask"][row] == 1].tolist()
        assert now[:len(before) + len(sampled)] == before + sampled
        assert len(now) > len(before) + len(sampled) + 12  # the tool turn and its image's tokens follow


def test_greedy_turns_equal_transformers_generate_on_the_same_conversation(tiny_model: Any, make_obs, talkative):
    from transformers import Qwen3VLForConditionalGeneration

    observations = [make_obs(2)]
    advance = zoom_advance(tiny_model, observations, 1, max_turns=2)
    batch = run_episodes(engine(tiny_model, greedy=True), talkative, observations, 1, jax.random.key(0), advance, 2)
    assert len(batch.turns) == 2, "the greedy episode did not reach its second turn"
    hf = Qwen3VLForConditionalGeneration.from_pretrained(tiny_model.folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, value in _torch_params(talkative, tiny_model.cfg).items():
            hf.get_parameter(name).copy_(value)
        for turn in batch.turns:
            inputs = turn.prompt_inputs
            kwargs = {k: torch.from_numpy(np.asarray(inputs[k]).astype(np.int64))
                      for k in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw")}
            out = hf.generate(**kwargs, pixel_values=torch.from_numpy(inputs["pixel_values"]), do_sample=False,
                              max_new_tokens=NEW_TOKENS, eos_token_id=list(tiny_model.eos_ids),
                              pad_token_id=tiny_model.pad_id)
            expected = out[0, inputs["input_ids"].shape[1]:].numpy()
            length = int(turn.lengths[0])
            np.testing.assert_array_equal(turn.completion_ids[0, :length], expected[:length])


def _torch_params(params: Any, cfg: Any) -> dict[str, torch.Tensor]:
    """The one weight `talkative` changed, as transformers names it."""
    if cfg.tie_word_embeddings:
        return {"model.language_model.embed_tokens.weight": torch.from_numpy(np.asarray(params["text"]["embed"]))}
    return {"lm_head.weight": torch.from_numpy(np.asarray(params["lm_head"]["kernel"]).T.copy())}


def test_an_episode_that_goes_on_where_it_cannot_is_refused(tiny_model: Any, make_obs, talkative):
    observations = [make_obs(0)]
    sampler = engine(tiny_model, temperature=1.0)
    forever = zoom_advance(tiny_model, observations, GROUP, max_turns=99)
    with pytest.raises(RuntimeError, match="after max_turns=1"):
        run_episodes(sampler, talkative, observations, GROUP, jax.random.key(3), forever, 1)

    def ignores_the_turn(episode, text, ids, finish):
        return observations[0]

    cut = engine(tiny_model, temperature=1.0, max_new_tokens=1)  # every turn ends at the length budget
    with pytest.raises(RuntimeError, match="cannot continue"):
        run_episodes(cut, tiny_model.params, observations, GROUP, jax.random.key(3), ignores_the_turn, 2)
    with pytest.raises(ValueError, match="max_turns"):
        run_episodes(sampler, talkative, observations, GROUP, jax.random.key(3), forever, 0)

