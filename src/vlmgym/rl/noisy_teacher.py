"""SFT from an imperfect teacher (`sft.label_noise`): a fixed share of the train samples is labelled with another
train sample's ideal answer, a wrong but well-formed answer, as a teacher that errs would give it.

Which samples are mislabelled, and with which answer, follows from each sample's key alone (a hash), so the noisy
labels are the same for every seed, every epoch and every run: the dataset is noisy, not the draw. The reward the RL
arms train on stays exact; with label noise SFT imitates the errors and RL need not.
"""

from __future__ import annotations

import zlib

from vlmgym.envs.base import Env, State


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by `text`."""
    return zlib.crc32(text.encode()) / 2**32


class NoisyTeacher:
    """The SFT target of a train sample: its ideal answer, or for a `share` of the samples (by key) another
    sample's ideal answer that differs from it."""

    def __init__(self, env: Env, share: float):
        if not 0.0 <= share < 1.0:
            raise ValueError(f"sft.label_noise: expected a share in [0, 1), got {share!r}")
        self.env, self.share = env, share

    def mislabelled(self, key: str) -> bool:
        return self.share > 0 and _unit(f"label_noise:{key}") < self.share

    def target(self, state: State) -> tuple[str, bool]:
        """(the target taught for the sample, whether it is a wrong label)."""
        ideal = self.env.sft_target(state.meta)
        if not self.mislabelled(str(state.key)):
            return ideal, False
        samples = self.env.samples
        first = zlib.crc32(f"label_noise_source:{state.key}".encode()) % len(samples)
        for offset in range(len(samples)):
            other = self.env.sft_target(dict(samples[(first + offset) % len(samples)].meta))
            if other != ideal:
                return other, True
        return ideal, False  # every sample has this answer: there is no wrong label to give
