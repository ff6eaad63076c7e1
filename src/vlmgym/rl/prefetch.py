"""The next step's data work runs ahead in a background thread: the env resets (image decoding from the shards,
the truth) and the policy's processor work on the observations (resize, patchify, tokenize: `prepare`).

The trainers know the next indices before they need them (DataOrder.peek), so while a step samples and updates,
one worker thread resets the next step's samples and prepares their model inputs (RolloutEngine.prepare_ahead: the
sampler and the learner then find them ready); the step only waits for what is not ready yet, and logs that wait
(`data_wait_s`). The order and the resets are the same as without it, so results do not change; an env's
reset must not depend on its training progress (Env.set_progress: scoring only), as the next step's resets run
before its progress is set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only: importing this module does not load the envs
    from vlmgym.envs.base import Env


class ResetPrefetcher:
    """`resets(indices)` returns [env.reset(i) for i in indices], from a background run started by `ahead(indices)`
    when the indices match, else computed now; `take_wait()` is the time spent waiting since its last call."""

    def __init__(self, env: Env, prepare: Callable[[list], None] | None = None):
        self.env = env
        self.prepare = prepare  # the policy's processor work on the observations (resize, patchify, tokenize)
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple[tuple[int, ...], Future] | None = None
        self._wait = 0.0

    def _reset_all(self, indices: tuple[int, ...], prepare: bool = False) -> list:
        resets = [self.env.reset(i) for i in indices]
        if prepare and self.prepare is not None and resets:
            self.prepare([obs for _, obs in resets])
        return resets

    def resets(self, indices: list[int]) -> list:
        started = time.perf_counter()
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == tuple(indices):
            out = ahead[1].result()  # a failed reset (a corrupt image) raises here, as it would inline
        else:
            if ahead is not None:
                ahead[1].cancel()
            out = self._reset_all(tuple(indices))
        self._wait += time.perf_counter() - started
        return out

    def ahead(self, indices: list[int]) -> None:
        """Start resetting `indices` in the background (the next `resets` call's, when it asks for the same)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlmgym-data")
        self._ahead = (tuple(indices), self._pool.submit(self._reset_all, tuple(indices), True))

    def take_wait(self) -> float:
        """Seconds `resets` spent waiting for data since the last call."""
        wait, self._wait = self._wait, 0.0
        return wait

    def close(self) -> None:
        """Drop pending work and stop the thread."""
        self._ahead = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
