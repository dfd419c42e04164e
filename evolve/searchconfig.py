"""The ``[evolution]`` table: the search's strategy and settings (evolve/engine.py searches with them)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .operators import auto_population, auto_tournament
from .pareto import OBJECTIVES
from .settings import Check, Table, is_int

__all__ = ["AUTO", "EvolutionConfig", "STRATEGIES"]

STRATEGIES = ("evolution", "random")
AUTO = -1  # population_size or tournament_size given as "auto": sized by EvolutionConfig.sized


@dataclass(frozen=True)
class EvolutionConfig(Table):
    """The ``[evolution]`` table: search strategy and regularized-evolution settings.

    ``mutations = [lo, hi]``: each child gets between lo and hi mutations (uniform); an integer n means exactly n.
    ``objectives``: what the search optimises (evolve/pareto.py); more than one makes it NSGA-II.
    ``inherit``: a bred child starts from its first parent's trained weights where the layers match
    (evolve/inherit.py); the run keeps the weights of the population for it.
    ``immigrants``: the share of asks after the initial population that are random genomes instead of children
    (random immigrants, Grefenstette 1992). Children that inherit weights beat fresh networks trained as long, so
    without them the population closes on its first good lineage; with them a run keeps sampling the whole space,
    and a newcomer that beats the lineage joins the population.
    ``priors``: the initial population begins with the networks a practitioner writes first (evolve/priors.py),
    origin "prior"; random search never does.
    ``breeder_workers``: a job with at least this many workers breeds its children ahead in a helper process on
    rank 0's node (evolve/ahead.py), which takes breeding off rank 0's path per task but makes the run depend on
    timing as well as on its seed; 0 never does.
    ``population_size``, ``tournament_size``: "auto" (stored as -1) follows the W candidates trained at once:
    population min(max(16, W), 4096), tournament its square root (evolve/operators.py's ``auto_population``);
    an integer is used as given. ``cost_aware``: at a fitness within ``cost_tolerance`` of a tournament's fittest,
    fewer parameters win (single objective; several weigh ``params`` as an objective instead).
    ``rungs``, ``reduction_factor``: multi-fidelity (evolve/rungs.py). Every candidate trains ``[train] epochs``
    first; the best 1/``reduction_factor`` of those go on from their checkpoints to ``reduction_factor`` times as
    many epochs in all, and so on up to ``rungs`` rungs, on one warm-up, stable, decay schedule whose rate decays
    to zero at the end of each rung; tournaments prefer parents from higher rungs, and the run's best network is
    the best by validation score of any rung. 1: every candidate trains ``[train] epochs`` once, on one cycle.
    ``finish``: the last share of a time budget trains the best networks on (galapagos/flows/finish.py).
    """

    section = "evolution"
    choices = {"strategy": STRATEGIES, "objectives": tuple(OBJECTIVES)}

    strategy: str = "evolution"
    population_size: int = AUTO  # the most recent finished results that parents are chosen from (ageing out);
    # "auto" (stored as -1): the results told in about one training time, W for W candidates trained at once (worker
    # ranks times run.pack), at least 16, at most 4096; breeding starts once it holds a tournament's worth

    tournament_size: int = AUTO  # genomes drawn from the population per parent; the fittest of them is the parent;
    # "auto" (stored as -1): the square root of the population (16 -> 4, 1,000 -> 32, 4,096 -> 64), which keeps the
    # generations selection takes to fill the population with its best (ln P / ln S) at the 2 of 16/4 at any size

    crossover_prob: float = 0.3  # share of children bred from two parents (the rest: one parent, mutated)
    mutations: tuple[int, int] = (1, 2)
    seed: int = 0  # the search's random seed (random genomes, selection, crossover and mutation)
    objectives: tuple[str, ...] = ("fitness",)
    inherit: bool = True  # children start from a parent's trained weights where the layers match
    immigrants: float = 0.25  # share of random genomes among the asks after the initial population
    priors: bool = True  # the initial population begins with a practitioner's networks (evolve/priors.py)
    breeder_workers: int = 256  # from this many workers on, a helper process breeds ahead (evolve/ahead.py) and a
    # fresh run's first round is drawn by the workers themselves (evolve/drawn.py); 0: never

    cost_aware: bool = False  # at nearly equal fitness a tournament prefers the network with fewer parameters;
    # single objective only. Off until the search benchmark (bench/search.py) shows whether it pays: the default will
    # be its measurement's

    rungs: int = 1  # multi-fidelity: the training lengths a candidate may reach, [train] epochs times
    # reduction_factor**k for k below rungs; 1: one, [train] epochs

    reduction_factor: int = 3  # the share of a rung that goes on (1 in this many) and how much longer it trains

    surrogate: int = 0  # children bred per ask, of which the one a model of the results so far predicts best is
    # asked (evolve/surrogate.py); 0 or 1: one child, no model. Off until the search benchmark shows it pays

    finish: float = 0.0  # the share of the time budget at its end in which the search stops breeding and its best
    # networks train on from their weights for as long as that time allows (galapagos/flows/finish.py); 0: none

    cost_tolerance: float = 0.001  # how near: fitness (accuracy, or mean R^2) within this of a tournament's fittest
    # counts as equal; 0.001 is one sample in 1,000 of validation, so a smaller validation split only breaks exact ties

    def normalise(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mutations": (self.mutations, self.mutations)} if is_int(self.mutations) else {}
        out.update({key: AUTO for key in ("population_size", "tournament_size") if getattr(self, key) == "auto"})
        return out

    def sized(self, workers: int) -> EvolutionConfig:
        """With "auto" sizes resolved for ``workers`` candidates trained at once: what a run should record, so that
        its resumption on another job size breeds as it did."""
        if not is_int(workers) or workers < 1:
            raise ValueError(f"sized: expected a positive number of workers, got {workers!r}")
        population = self.population_size
        if population == AUTO:
            population = max(auto_population(workers), self.tournament_size)
        tournament = auto_tournament(population) if self.tournament_size == AUTO else self.tournament_size
        return replace(self, population_size=population, tournament_size=tournament)

    def checks(self) -> list[Check]:
        m = self.mutations
        pop, tour = self.population_size, self.tournament_size
        return [
            ("population_size", pop >= 1 or pop == AUTO, 'a positive integer or "auto"'),
            ("tournament_size", tour == AUTO or 1 <= tour <= (pop if pop != AUTO else math.inf),
             'a positive integer or "auto"' + (f", at most population_size={pop}" if pop != AUTO else "")),
            ("cost_tolerance", self.cost_tolerance >= 0 and math.isfinite(self.cost_tolerance), "a number >= 0"),
            ("crossover_prob", 0.0 <= self.crossover_prob <= 1.0, "a probability in [0, 1]"),
            ("immigrants", 0.0 <= self.immigrants < 1.0, "a share in [0, 1)"),
            ("finish", 0.0 <= self.finish < 1.0, "a share of the time budget in [0, 1)"),
            ("rungs", is_int(self.rungs) and 1 <= self.rungs <= 8 and (self.rungs == 1 or len(self.objectives) == 1),
             "an integer from 1 to 8" + (" (1 with several objectives)" if len(self.objectives) > 1 else "")),
            ("reduction_factor", is_int(self.reduction_factor) and self.reduction_factor >= 2, "an integer >= 2"),
            ("surrogate", is_int(self.surrogate) and 0 <= self.surrogate <= 64, "an integer from 0 to 64"),
            ("breeder_workers", is_int(self.breeder_workers) and self.breeder_workers >= 0, "an integer >= 0"),
            ("mutations", len(m) == 2 and all(is_int(v) for v in m) and 1 <= m[0] <= m[1],
             "an integer >= 1 or [low, high] with 1 <= low <= high"),
            ("objectives", "fitness" in self.objectives and len(set(self.objectives)) == len(self.objectives),
             f"a list of distinct names from {', '.join(OBJECTIVES)} that includes fitness"),
        ]
