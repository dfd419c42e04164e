"""The random start drawn by the workers: a job with many workers sends its first round as draws, not genomes.

A fresh run's first round is random genomes (nothing has been told yet to breed from). At whole-machine scale
breeding them on rank 0's node was the first round's cost: about 100 us each (sampling, the check and repair,
the parameter count), 13 s for 127,488 workers in one helper process (bench/scale.py), while every worker waited.
A draw is the candidate's id: the worker that gets it samples the genome itself, from the run's seed and that id,
exactly as :func:`draw` does here, and sends it back with the task's result (the payload's ``echo``), so the
master journals and tells it as any other. One worker's draw costs its own rank 100 us once; rank 0 only hands
out ids.

A draw does not avoid the genomes the run has seen (a worker does not know them): in a space of this size two
draws of one genome are rare, and a duplicate costs one evaluation. Only a job that breeds ahead in a helper process
(``[evolution] breeder_workers``) draws: its order of results is no seed's to decide anyway, while a small job
keeps the engine's own random start and its reproducible sequence.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from .check import check_genome
from .errors import InvalidGenome, SearchExhausted
from .genome import Genome
from .problem import Problem
from .space import SearchSpace

__all__ = ["Drawn", "draw"]

TRIES = 200  # samples before a draw gives up (as the engine's random start)


@dataclass(frozen=True)
class Drawn:
    """How a worker draws candidate `cid`'s genome: the run's search space and seed."""

    space: SearchSpace
    seed: int
    cid: int

    def genome(self, problem: Problem) -> Genome:
        return draw(self.space, problem, self.seed, self.cid)


def draw(space: SearchSpace, problem: Problem, seed: int, cid: int) -> Genome:
    """Candidate `cid`'s random genome, checked and repaired for `problem`: the same on every rank."""
    rng = random.Random(f"galapagos:draw:{seed}:{cid}")
    last: InvalidGenome | None = None
    for _ in range(TRIES):
        try:
            return check_genome(space.random_genome(rng, problem), problem, space)
        except InvalidGenome as e:
            last = e
    raise SearchExhausted(f"no valid random genome in {TRIES} samples for candidate {cid}: the search space seems "
                          f"too tight (widen [space]); last rejection: {last}")
