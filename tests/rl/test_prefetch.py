"""The next step's resets run ahead in a thread: same resets and order, the wait is measured, errors surface."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from toy import ToyEnv

from vlmgym.rl.loop import DataOrder
from vlmgym.rl.prefetch import ResetPrefetcher


class CountingEnv(ToyEnv):
    """Records which thread reset which index; index `slow` takes a while, index `bad` raises."""

    def __init__(self, slow: int = -1, bad: int = -1):
        super().__init__(num_prompts=8)
        self.calls: list[tuple[int, str]] = []
        self.slow, self.bad = slow, bad

    def reset(self, idx):
        self.calls.append((idx, threading.current_thread().name))
        if idx == self.slow:
            time.sleep(0.3)
        if idx == self.bad:
            raise ValueError(f"sample {idx}: corrupt image")
        return super().reset(idx)


def test_peek_is_the_next_take_and_moves_nothing():
    order = DataOrder(5, seed=3)
    order.take(3)
    peeked = order.peek(4)  # crosses into the next epoch's permutation
    assert order.state() == {"epoch": 0, "position": 3}
    assert order.take(4) == peeked and order.state() == {"epoch": 1, "position": 2}


def test_ahead_runs_in_the_background_and_serves_the_same_resets():
    env = CountingEnv()
    prefetch = ResetPrefetcher(env)
    inline = prefetch.resets([1, 2])
    assert [(i, t) for i, t in env.calls] == [(1, "MainThread"), (2, "MainThread")]
    prefetch.ahead([3, 4])
    served = prefetch.resets([3, 4])
    assert [c for c in env.calls[2:]] and all(t.startswith("vlmgym-data") for _, t in env.calls[2:])
    assert [s.key for s, _ in served] == ["3", "4"] and [s.key for s, _ in inline] == ["1", "2"]
    assert served[0][1] == env.reset(3)[1]
    prefetch.close()


def test_other_indices_than_prefetched_are_reset_now():
    env = CountingEnv()
    prefetch = ResetPrefetcher(env)
    prefetch.ahead([5, 6])
    time.sleep(0.1)
    assert [s.key for s, _ in prefetch.resets([0, 1])] == ["0", "1"]
    assert env.calls[-2:] == [(0, "MainThread"), (1, "MainThread")]
    prefetch.close()


def test_the_wait_is_measured_and_taken_once():
    prefetch = ResetPrefetcher(CountingEnv(slow=2))
    prefetch.ahead([2])
    prefetch.resets([2])
    wait = prefetch.take_wait()
    assert 0.1 < wait < 5 and prefetch.take_wait() == 0.0
    prefetch.ahead([7])
    time.sleep(0.2)  # ready before it is asked for: (almost) no wait
    prefetch.resets([7])
    assert prefetch.take_wait() < 0.1
    prefetch.close()


def test_a_failed_background_reset_raises_where_the_data_is_needed():
    prefetch = ResetPrefetcher(CountingEnv(bad=4))
    prefetch.ahead([3, 4])
    with pytest.raises(ValueError, match="sample 4: corrupt image"):
        prefetch.resets([3, 4])
    prefetch.close()


def test_the_processor_work_runs_ahead_too(tiny_vlm):
    # The policy's processor (resize, patchify, tokenize) runs in the data thread on the prefetched observations;
    # the sampler and the learner then get those inputs back without processing the images again.
    from vlmgym.envs.geospot import GeospotEnv
    from vlmgym.rl.policy import Qwen3VLPolicy
    from vlmgym.rollout.sampling import SamplingSettings

    settings = SamplingSettings(max_new_tokens=4, eos_ids=tuple(tiny_vlm.processor.eos_token_ids),
                                pad_id=int(tiny_vlm.processor.pad_token_id))
    policy = Qwen3VLPolicy(tiny_vlm.cfg, tiny_vlm.processor, settings)
    threads = []
    processor = policy.engine.processor

    def counted(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return processor(*args, **kwargs)

    policy.engine.processor = counted
    prefetch = ResetPrefetcher(GeospotEnv(tiny_vlm.samples), policy.prepare_ahead)
    prefetch.ahead([0, 1])
    observations = [obs for _, obs in prefetch.resets([0, 1])]
    prepared = policy.engine.prepare(observations)
    assert len(threads) == 1 and threads[0].startswith("vlmgym-data")
    fresh = processor([o["messages"] for o in observations], [o["images"] for o in observations],
                      padding_side="left", buckets=policy.buckets.prompt_lengths)
    assert prepared.keys() == fresh.keys()
    for name in fresh:
        assert (prepared[name] == fresh[name]).all(), name
    tokens = np.zeros((2, 4), np.int32)
    policy.build_batch(observations, tokens, np.ones((2, 4), np.float32))  # the learner's prompts: ready too
    assert len(threads) == 1
    # Equal but other observation objects: processed again, now.
    policy.engine.prepare([dict(o) for o in observations])
    assert threads[1:] == ["MainThread"]
    prefetch.close()
