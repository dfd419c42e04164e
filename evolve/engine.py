"""The asynchronous steady-state search: ask for a candidate, tell its fitness, in any order, no generations.

Regularized evolution (Real et al., 2019, "Regularized Evolution for Image Classifier Architecture Search"):
the population is the ``population_size`` most recently *told* results; each new child comes from a tournament
among them; the oldest result leaves as a new one arrives (ageing), so a lucky early evaluation cannot dominate
forever. Only finished trainings join it: a pruned candidate's fitness is a partial training's and a failed one
has none, and either would push a fully trained member out (with median pruning most candidates are pruned, and a
good early network aged out before it was ever a parent). This suits thousands of workers finishing at different
times: the master asks whenever a worker is free.

Every ask draws from its own generator seeded by (seed, candidate id), so a run is determined by its seed and
the order of tells, and a resumed run (:meth:`Engine.replay`) proposes what the uninterrupted run would have.

With several ``objectives`` (evolve/pareto.py) the population is elitist instead: NSGA-II's survivors (whole
nondominated fronts, the last cut by crowding distance) among the results so far, and parents win crowded
tournaments (lower front, then less crowded). Ageing would throw away points of the front that took long to find.
"""

from __future__ import annotations

import collections
import logging
import math
import random
from dataclasses import dataclass
from typing import Any, Iterable

from .check import check_genome
from .errors import InvalidGenome, SearchExhausted
from .genome import Genome
from .operators import crossover, mutate, select
from .pareto import OBJECTIVES, Values, crowded_tournament, nsga2_rank, nsga2_survivors, objective_values
from .priors import prior_genomes
from .problem import Problem
from .settings import Check, Table, is_int
from .space import SearchSpace

__all__ = ["Candidate", "Engine", "EvolutionConfig", "ORIGINS", "STRATEGIES"]

log = logging.getLogger(__name__)

STRATEGIES = ("evolution", "random")
ORIGINS = ("seed", "prior", "random", "mutation", "crossover")
# Bounded retries before giving up on a fresh genome: breeding first, then random sampling.
_BREED_TRIES = 50
_RANDOM_TRIES = 200


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
    """

    section = "evolution"
    choices = {"strategy": STRATEGIES, "objectives": tuple(OBJECTIVES)}

    strategy: str = "evolution"
    population_size: int = 16  # the most recent finished results that parents are chosen from (ageing out)
    tournament_size: int = 4  # genomes drawn from the population per parent; the fittest of them is the parent
    crossover_prob: float = 0.3  # share of children bred from two parents (the rest: one parent, mutated)
    mutations: tuple[int, int] = (1, 2)
    seed: int = 0  # the search's random seed (random genomes, selection, crossover and mutation)
    objectives: tuple[str, ...] = ("fitness",)
    inherit: bool = True  # children start from a parent's trained weights where the layers match
    immigrants: float = 0.25  # share of random genomes among the asks after the initial population
    priors: bool = True  # the initial population begins with a practitioner's networks (evolve/priors.py)
    breeder_workers: int = 256  # from this many workers on, a helper process breeds ahead (evolve/ahead.py); 0: never

    def normalise(self) -> dict[str, Any]:
        return {"mutations": (self.mutations, self.mutations)} if is_int(self.mutations) else {}

    def checks(self) -> list[Check]:
        m = self.mutations
        return [
            ("population_size", self.population_size >= 1, "a positive integer"),
            ("tournament_size", 1 <= self.tournament_size <= self.population_size,
             f"an integer in [1, population_size={self.population_size}]"),
            ("crossover_prob", 0.0 <= self.crossover_prob <= 1.0, "a probability in [0, 1]"),
            ("immigrants", 0.0 <= self.immigrants < 1.0, "a share in [0, 1)"),
            ("breeder_workers", is_int(self.breeder_workers) and self.breeder_workers >= 0, "an integer >= 0"),
            ("mutations", len(m) == 2 and all(is_int(v) for v in m) and 1 <= m[0] <= m[1],
             "an integer >= 1 or [low, high] with 1 <= low <= high"),
            ("objectives", "fitness" in self.objectives and len(set(self.objectives)) == len(self.objectives),
             f"a list of distinct names from {', '.join(OBJECTIVES)} that includes fitness"),
        ]


@dataclass(frozen=True)
class Candidate:
    """A genome handed out for evaluation, with where it came from (parent ids; random/mutation/crossover) and,
    when whoever bred it counted them (evolve/ahead.py), its parameters."""

    id: int
    genome: Genome
    parents: tuple[int, ...] = ()
    origin: str = "random"
    params: int | None = None


def _clean_fitness(fitness: float | None) -> float | None:
    """None for anything that is not a finite number: failures rank below every real result."""
    if fitness is None or isinstance(fitness, bool):
        return None
    try:
        value = float(fitness)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class Engine:
    """Ask/tell search over a :class:`SearchSpace` for a :class:`Problem`; higher fitness is better."""

    def __init__(self, space: SearchSpace, problem: Problem, config: EvolutionConfig | None = None) -> None:
        self.space = space
        self.problem = problem
        self.config = config if config is not None else EvolutionConfig()
        self._next_id = 0
        self._pending: dict[int, Candidate] = {}
        self._told: set[int] = set()
        self._seen: set[str] = set()
        self._population: collections.deque[tuple[Candidate, float | None]] = collections.deque(
            maxlen=self.config.population_size
        )
        self._best: tuple[int, Genome, float] | None = None
        self._elite: list[tuple[Candidate, Values]] = []  # several objectives: NSGA-II's survivors
        self._ranked: list[tuple[Candidate, int, float]] | None = None  # the elite's fronts and crowding, cached
        self._seeds: collections.deque[Genome] = collections.deque()  # asked first (warm start)
        self._priors: collections.deque[Genome] = collections.deque(
            prior_genomes(space, problem) if self.config.priors and self.config.strategy == "evolution" else ())

    # --- state ---
    @property
    def best(self) -> tuple[int, Genome, float] | None:
        """(id, genome, fitness) of the best result told so far (first one on ties), None before any success."""
        return self._best

    @property
    def num_told(self) -> int:
        return len(self._told)

    @property
    def pending(self) -> tuple[int, ...]:
        """Ids asked but not yet told, oldest first."""
        return tuple(self._pending)

    @property
    def population(self) -> list[tuple[Candidate, float | None]]:
        """The ageing population, oldest first: the last ``population_size`` finished evaluations told."""
        return list(self._population)

    @property
    def multi_objective(self) -> bool:
        return len(self.config.objectives) > 1

    @property
    def elite(self) -> list[tuple[Candidate, Values]]:
        """Several objectives: the population parents come from (NSGA-II survivors, with their objective values)."""
        return list(self._elite)

    def candidate(self, candidate_id: int) -> Candidate:
        """A pending candidate by id."""
        return self._pending[candidate_id]

    def seed(self, genomes: Iterable[Genome]) -> int:
        """Warm start: checked (and repaired) for this problem, these genomes are asked first, in order, in place
        of random ones; those that cannot build or repeat one seen are skipped. Returns how many were queued."""
        queued = 0
        for genome in genomes:
            try:
                genome = check_genome(genome, self.problem, self.space)
            except InvalidGenome as e:
                log.warning("seed genome skipped: %s", e)
                continue
            if genome.key not in self._seen and all(genome.key != g.key for g in self._seeds):
                self._seeds.append(genome)
                queued += 1
        return queued

    # --- ask / tell ---
    def ask(self) -> Candidate:
        """The next candidate to evaluate: the seed genomes first, then random until ``population_size`` have
        been asked, then bred (a share ``immigrants`` of them random)."""
        cid = self._next_id
        rng = random.Random(f"galapagos:{self.config.seed}:{cid}")
        random_phase = (
            self.config.strategy == "random"
            or self.num_told + len(self._pending) < self.config.population_size
            or not (self._elite if self.multi_objective else self._population)
            or rng.random() < self.config.immigrants
        )
        if self._seeds:
            genome, parents, origin = self._seeds.popleft(), (), "seed"
        elif random_phase and (prior := self._prior()) is not None:
            genome, parents, origin = prior, (), "prior"
        else:
            bred = None if random_phase else self._breed(rng)
            genome, parents, origin = bred if bred is not None else (self._random(rng), (), "random")
        candidate = Candidate(id=cid, genome=genome, parents=parents, origin=origin)
        self._next_id += 1
        self._pending[cid] = candidate
        self._seen.add(genome.key)
        return candidate

    def adopt(self, candidate: Candidate) -> None:
        """Take a candidate bred elsewhere from a copy of this engine (evolve/ahead.py) as if asked here."""
        if candidate.origin == "seed" and self._seeds:
            self._seeds.popleft()
        if candidate.origin == "prior":
            self._prior()
        self._next_id = max(self._next_id, candidate.id + 1)
        self._pending[candidate.id] = candidate
        self._seen.add(candidate.genome.key)

    def tell(self, candidate_id: int, fitness: float | None, status: str = "ok", values: Values | None = None
             ) -> None:
        """Report a result. Only a finished one (``status`` "ok" and a finite ``fitness``) joins the population;
        a pruned or failed one (timeout, NaN, crash: ``fitness`` None) stays out of it, though it counts as told
        and a pruned one's fitness as a result (``best``).
        With several objectives, ``values`` holds one per objective (:func:`objective_values`); None leaves the
        candidate out of the population."""
        candidate = self._pending.pop(candidate_id, None)
        if candidate is None:
            what = "already told" if candidate_id in self._told else "never asked"
            raise KeyError(f"tell: candidate {candidate_id} is not pending ({what})")
        self._record(candidate, fitness, status, values)

    def replay(self, records: Iterable[Any]) -> int:
        """Rebuild state from journal records, in order, as if each had been asked and told; returns how many were
        applied. Used by ``--resume``: afterwards ids continue after the largest, and no genome seen in the journal
        is proposed again.

        Records are read by attribute (the application's journal records are such objects): ``id``, ``genome``
        (its JSON or a Genome), ``parents`` (ids, or None), ``origin`` (None: told by the number of parents),
        ``fitness`` and ``status``; with several objectives also ``params`` and ``metrics`` (:class:`.pareto.Scored`).
        """
        applied = 0
        for i, rec in enumerate(records):
            try:
                cid, raw_genome = rec.id, rec.genome
            except AttributeError:
                raise ValueError(f"replay: record {i} lacks 'id' or 'genome': {rec!r}") from None
            if not is_int(cid) or cid < 0:
                raise ValueError(f"replay: record {i} has a bad id {cid!r}")
            if cid in self._told:
                log.warning("replay: candidate %d appears more than once; keeping the first record", cid)
                continue
            try:
                genome = Genome.from_json(raw_genome)
            except InvalidGenome as e:
                raise InvalidGenome(f"replay: record {i} (id {cid}): {e}") from None
            parents = tuple(int(p) for p in (rec.parents or ()))
            origin = rec.origin or ("random" if not parents else "mutation" if len(parents) == 1 else "crossover")
            candidate = self._pending.pop(cid, None) or Candidate(cid, genome, parents, origin)
            self._seen.add(genome.key)
            self._next_id = max(self._next_id, cid + 1)
            values = objective_values(rec, self.config.objectives) if self.multi_objective else None
            self._record(candidate, rec.fitness, rec.status, values)
            applied += 1
        return applied

    def close(self) -> None:
        """Nothing to release (an :class:`evolve.ahead.Ahead` stops its helper)."""

    # --- internals ---
    def _record(self, candidate: Candidate, fitness: float | None, status: str, values: Values | None) -> None:
        value = _clean_fitness(fitness)
        self._told.add(candidate.id)
        finished = status == "ok" and value is not None
        if finished:
            self._population.append((candidate, value))
        if self.multi_objective and finished and values is not None:
            pairs = [((c, v), v) for c, v in self._elite + [(candidate, tuple(values))]]
            self._elite = nsga2_survivors(pairs, self.config.population_size, self.config.objectives)
            self._ranked = None
        if value is not None and (self._best is None or value > self._best[2]):
            self._best = (candidate.id, candidate.genome, value)
        log.debug("told %d (%s): fitness %s", candidate.id, status, value)

    def _prior(self) -> Genome | None:
        """The next of the practitioner's networks still to ask in the initial population: checked (and repaired)
        for this problem, not seen before (a resumed run replayed it), None when they are used up."""
        while self._priors and self.num_told + len(self._pending) < self.config.population_size:
            try:
                genome = check_genome(self._priors.popleft(), self.problem, self.space)
            except InvalidGenome as e:
                log.debug("prior network left out: %s", e)
                continue
            if genome.key not in self._seen:
                return genome
        return None

    def _random(self, rng: random.Random) -> Genome:
        last_error: InvalidGenome | None = None
        for _ in range(_RANDOM_TRIES):
            try:
                genome = check_genome(self.space.random_genome(rng, self.problem), self.problem, self.space)
            except InvalidGenome as e:
                last_error = e
                continue
            if genome.key not in self._seen:
                return genome
        reason = f"; last rejection: {last_error}" if last_error is not None else ""
        raise SearchExhausted(
            f"no new valid genome in {_RANDOM_TRIES} random samples after {len(self._seen)} distinct genomes: "
            f"the search space seems exhausted or too tight (widen [space]){reason}"
        )

    def _select(self, k: int, rng: random.Random) -> list[Candidate]:
        """``k`` parents: tournament winners by fitness, or with several objectives crowded-tournament winners."""
        if not self.multi_objective:
            return select(list(self._population), k, self.config.tournament_size, rng)
        if self._ranked is None:
            self._ranked = nsga2_rank(self._elite, self.config.objectives)
        return crowded_tournament(self._ranked, k, self.config.tournament_size, rng)

    def _breed(self, rng: random.Random) -> tuple[Genome, tuple[int, ...], str] | None:
        cfg = self.config
        size = len(self._elite if self.multi_objective else self._population)
        for _ in range(_BREED_TRIES):
            if size >= 2 and rng.random() < cfg.crossover_prob:
                a, b = self._select(2, rng)
                if a.id == b.id:
                    (b,) = self._select(1, rng)
            else:
                a = b = self._select(1, rng)[0]
            if a.id != b.id:
                child, parents, origin = crossover(a.genome, b.genome, rng), (a.id, b.id), "crossover"
            else:
                child, parents, origin = a.genome, (a.id,), "mutation"
            child = mutate(child, self.space, self.problem, rng, n=rng.randint(*cfg.mutations))
            try:
                child = check_genome(child, self.problem, self.space)
            except InvalidGenome as e:
                log.debug("bred child rejected: %s", e)
                continue
            if child.key not in self._seen:
                return child, parents, origin
        log.debug("no new child after %d tries; sampling at random", _BREED_TRIES)
        return None
