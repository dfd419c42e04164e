"""The master's count of the tasks each worker rank holds against its capacity (launch/runtime.py)."""
from __future__ import annotations

from collections import OrderedDict, defaultdict


class Slots:
    """How many tasks each worker rank holds, with the ranks bucketed by that count less their capacity (run.pack),
    so that the least loaded rank is found without looking at every rank: at whole-machine scale (tens of thousands
    of workers) a sort of all of them per dispatch would fill the master's time (bench/scale.py). The buckets are
    OrderedDicts, whose first entry is found through their linked list: a plain dict's `next(iter(d))` steps over
    the holes that every rank leaving the bucket leaves behind, until the dict happens to resize (after the first
    round of 100,000 workers, the empty idle bucket held 100,000 of them: 40-70 us a dispatch instead of 4). A rank
    of capacity k holding n tasks is in bucket n - k + 1: with k = 1, as before packing, the count it holds."""

    def __init__(self) -> None:
        self.held: dict[int, int] = {}
        self.spare: dict[int, int] = {}  # rank -> its capacity less one
        self.by_count: dict[int, OrderedDict[int, None]] = defaultdict(OrderedDict)  # load -> its ranks, in order
        self.lowest, self.idle = 0, 0  # the lowest load a rank can have (1 - the largest capacity); ranks holding none

    def add(self, rank: int, capacity: int = 1) -> None:
        """A rank ready for `capacity` tasks at once; one already here keeps what it holds (a new capacity)."""
        n = self.held.get(rank, 0)
        self.remove(rank)
        self.held[rank], self.spare[rank] = n, capacity - 1
        self.by_count[n - capacity + 1][rank] = None
        self.lowest = min(self.lowest, 1 - capacity)
        self.idle += n == 0

    def remove(self, rank: int) -> None:
        if (n := self.held.pop(rank, None)) is not None:
            del self.by_count[n - self.spare.pop(rank)][rank]
            self.idle -= n == 0

    def change(self, rank: int, delta: int) -> None:
        n, spare = self.held[rank], self.spare[rank]
        del self.by_count[n - spare][rank]
        self.held[rank] = n + delta
        self.by_count[n + delta - spare][rank] = None
        self.idle += (n + delta == 0) - (n == 0)

    def capacity(self, rank: int) -> int:
        return self.spare.get(rank, 0) + 1

    def least_loaded(self, most: int) -> int | None:
        """A rank of the lowest load (tasks held less its capacity, plus one), if that is at most `most` (queued)."""
        for n in range(self.lowest, most + 1):
            if self.by_count[n]:
                return next(iter(self.by_count[n]))
        return None

    @property
    def busy(self) -> int:
        return len(self.held) - self.idle
