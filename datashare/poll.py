"""Polling with a growing sleep, for every rank that waits on a message without a blocking receive.

It lives here, in the lowest package, because both datashare (the node leader's answer during the data's sharing)
and launch (the master and worker loops, re-exported as launch.mpi.Backoff) poll, and datashare may import nothing
above it.
"""
from __future__ import annotations

import time


class Backoff:
    """Sleeps between polls, from `first` growing to `longest` while nothing happens.

    MPICH spins inside blocking receives; polling with a short sleep keeps idle ranks off the CPU that
    training needs, at a latency of at most `longest` seconds. The first sleep (`first`, and again after
    `reset`) is 0 unless asked otherwise: poll again at once before sleeping at all.
    """

    def __init__(self, longest: float = 1e-3, shortest: float = 1e-6, first: float = 0.0):
        self.longest, self.shortest, self.first, self.now = longest, shortest, first, first

    def reset(self) -> None:
        self.now = self.first

    def sleep(self) -> None:
        time.sleep(self.now)
        self.now = min(self.longest, max(self.shortest, self.now * 2))
