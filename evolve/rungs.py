"""Asynchronous successive halving (ASHA: Li et al., 2020, "A System for Massively Parallel Hyperparameter Tuning"):
the rungs of a multi-fidelity search and which of their results train on.

Rung k ends at epoch ``epochs * factor**k`` of one schedule that spans the last rung's, warm-up, stable, decay
(Hägele et al., 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations"): the learning rate
stays at the genome's until the last ``COOLDOWN`` of a rung's epochs, where it decays to zero before the rung's score
is read, so that every rung's score is a finished training's and scores compare across rungs. The state at the start
of that decay is the rung's checkpoint (evolve/checkpoint.py), from which a promotion trains on at the same learning
rate to the next rung's decay: the schedule never restarts (evolve/train.py). A result at rung k below the last is
*promotable* while it is among the best ``n // factor`` of the ``n`` results of its rung so far; whenever a worker is
free the engine promotes the best promotable result of the highest rung that has one, before it asks anything new
(ASHA's rule: no barrier, no rung waits to fill). Its continuation trains the same network from its checkpoint to
the next rung's end.

Each rung keeps its results in two heaps, the top share and the rest, so that a result costs O(log n) however many
a run finishes (bench/scale.py's rank 0 finishes hundreds a second). A result's checkpoint is worth keeping only
while it may still be promoted: in the top share, or among the best ``SPARE`` of the rest, one of which moves up
when the share grows by one; the others' checkpoints are *released* (the run deletes the files). A released result
that moves up later is not promoted: it would have to train again from its start.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Iterable

__all__ = ["COOLDOWN", "Rung", "Rungs", "SPARE", "cooldowns", "rung_ends"]

COOLDOWN = 0.25  # the share of a rung's epochs (those past the rung below) whose learning rate decays to zero
SPARE = 4  # checkpoints kept below each rung's top share, for the results that move up into it as it grows


class Rung:
    """The results of one rung below the last: its top share, the rest, and the promotable among them.

    A result is keyed (fitness, -id): the fitter, then the earlier, is better."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.top: list[tuple[float, int]] = []  # min-heap of keys: the best n // factor results
        self.rest: list[tuple[float, int]] = []  # max-heap, negated keys: the others
        self.spare: list[tuple[float, int]] = []  # keys of the best of the rest whose checkpoints are kept
        self.held: dict[int, Any] = {}  # id -> its candidate, for the results whose checkpoints are kept and that
        # are not promoted
        self.ready: list[tuple[float, int]] = []  # (-fitness, id), a heap: the held as they entered the top share;
        # those that left it or were promoted since are skipped
        self.released: list[int] = []  # ids whose checkpoints are no longer needed, since the last `take_released`

    def __len__(self) -> int:
        return len(self.top) + len(self.rest)

    def add(self, cid: int, fitness: float, candidate: Any = None) -> None:
        """A finished result, whose checkpoint exists."""
        key = (fitness, -cid)
        self.held[cid] = candidate
        if self.top and key > self.top[0]:
            key, new = heapq.heapreplace(self.top, key), key  # the top share's worst moves down
            self._enter_top(new)
        self._to_rest(key)
        while len(self.top) < len(self) // self.factor:  # the share grows by one every `factor` results
            up = heapq.heappop(self.rest)
            up = (-up[0], -up[1])
            if up in self.spare:
                self.spare.remove(up)
            heapq.heappush(self.top, up)
            self._enter_top(up)

    def _enter_top(self, key: tuple[float, int]) -> None:
        if -key[1] in self.held:
            heapq.heappush(self.ready, (-key[0], -key[1]))

    def _to_rest(self, key: tuple[float, int]) -> None:
        heapq.heappush(self.rest, (-key[0], -key[1]))
        if -key[1] not in self.held:
            return
        self.spare.append(key)
        if len(self.spare) > SPARE:
            self.spare.remove(low := min(self.spare))
            self.held.pop(-low[1], None)
            self.released.append(-low[1])

    def _in_top(self, key: tuple[float, int]) -> bool:
        return bool(self.top) and key >= self.top[0]

    def best_promotable(self) -> tuple[float, int] | None:
        """(fitness, id) of the best held result in the top share, None if there is none."""
        while self.ready:
            negated, cid = self.ready[0]
            if cid in self.held and self._in_top((-negated, -cid)):
                return -negated, cid
            heapq.heappop(self.ready)
        return None

    def promote(self, cid: int) -> None:
        """`cid` goes on to the next rung: its checkpoint is the continuation's now (the run deletes it once that
        has finished)."""
        self.held.pop(cid, None)

    def forget(self, cid: int) -> None:
        """`cid`'s checkpoint is gone (a resumed run found no file): it cannot be promoted."""
        self.held.pop(cid, None)
        self.spare = [k for k in self.spare if k[1] != -cid]


def rung_ends(epochs: int, factor: int, rungs: int) -> tuple[int, ...]:
    """The epoch each rung ends at: the first after `epochs`, each later one `factor` times as long in all."""
    return tuple(epochs * factor ** k for k in range(rungs))


def cooldowns(ends: tuple[int, ...]) -> tuple[int, ...]:
    """The epoch after which each rung's learning rate decays (its checkpoint's): the last ``COOLDOWN`` of the epochs
    it adds to the rung below, at least one, so that a rung of 6 epochs decays over 2, the next of 18 over 3."""
    return tuple(end - max(1, math.ceil(COOLDOWN * (end - before))) for before, end in zip((0, *ends), ends))


class Rungs:
    """The results of every rung of a run but the last (whose results go no further)."""

    def __init__(self, factor: int, rungs: int) -> None:
        self.last = rungs - 1
        self.rungs = [Rung(factor) for _ in range(rungs - 1)]

    def add(self, rung: int, cid: int, fitness: float, candidate: Any = None) -> None:
        if rung < self.last:
            self.rungs[rung].add(cid, fitness, candidate)

    def promote(self) -> tuple[int, Any] | None:
        """(rung, candidate) of the result to promote now, the best promotable one of the highest rung that has one,
        which goes on to the next rung; None if there is none."""
        for k in range(len(self.rungs) - 1, -1, -1):
            if (found := self.rungs[k].best_promotable()) is not None:
                candidate = self.rungs[k].held[found[1]]
                self.rungs[k].promote(found[1])
                return k, candidate
        return None

    def promoted(self, rung: int, cid: int) -> None:
        """`cid`, of `rung`, has gone on to the next (promoted elsewhere, or read back from a journal)."""
        if 0 <= rung < self.last:
            self.rungs[rung].promote(cid)

    def forget(self, ids: Iterable[int]) -> None:
        for cid in ids:
            for r in self.rungs:
                r.forget(cid)

    def held(self) -> set[int]:
        """Ids whose checkpoints may still be promoted."""
        return set().union(*(r.held.keys() for r in self.rungs))

    def take_released(self) -> list[int]:
        """Ids whose checkpoints are no longer needed, since the last call."""
        out = [cid for r in self.rungs for cid in r.released]
        for r in self.rungs:
            r.released.clear()
        return out
