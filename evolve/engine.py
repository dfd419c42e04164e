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

Sizes follow the job (:meth:`EvolutionConfig.sized`): a population of 16 at 27,648 workers turns over in
milliseconds, and the best of the random start (the first W asks, before anything is told) is a parent for 16 tells.
Breeding begins once the population holds a tournament's worth of results, a few dozen tells into a large job.

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

from .check import check_genome, count_params
from .errors import InvalidGenome, SearchExhausted
from .genome import Genome
from .operators import crossover, mutate, select
from .pareto import Values, crowded_tournament, nsga2_rank, nsga2_survivors, objective_values
from .priors import prior_genomes
from .problem import Problem
from .rungs import Rungs
from .searchconfig import AUTO, STRATEGIES, EvolutionConfig
from .surrogate import Surrogate
from .settings import is_int
from .space import SearchSpace

__all__ = ["AUTO", "Candidate", "Engine", "EvolutionConfig", "ORIGINS", "STRATEGIES"]

log = logging.getLogger(__name__)

ORIGINS = ("seed", "prior", "random", "mutation", "crossover", "promoted")
# Bounded retries before giving up on a fresh genome: breeding first, then random sampling.
_BREED_TRIES = 50
_RANDOM_TRIES = 200


@dataclass(frozen=True)
class Candidate:
    """A genome handed out for evaluation, with where it came from (parent ids; random/mutation/crossover, or
    promoted: its parent's network trained on to `rung`) and, when whoever bred it counted them (evolve/ahead.py), its
    parameters."""

    id: int
    genome: Genome
    parents: tuple[int, ...] = ()
    origin: str = "random"
    params: int | None = None
    rung: int = 0  # multi-fidelity: the rung it trains to (evolve/rungs.py)


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
    """Ask/tell search over a :class:`SearchSpace` for a :class:`Problem`; higher fitness is better.

    ``workers``: the candidates the job trains at once, which "auto" sizes follow (:meth:`EvolutionConfig.sized`);
    None sizes them as for one worker."""

    def __init__(self, space: SearchSpace, problem: Problem, config: EvolutionConfig | None = None,
                 workers: int | None = None) -> None:
        self.space = space
        self.problem = problem
        self.config = (config if config is not None else EvolutionConfig()).sized(workers or 1)
        self._next_id = 0
        self._pending: dict[int, Candidate] = {}
        self._pending_parents: collections.Counter[int] = collections.Counter()  # parent id -> pending children
        self._costs: dict[int, float] = {}  # cost_aware: id -> parameter count, of the population's members
        self._told: set[int] = set()
        self._seen: set[str] = set()
        self._population: collections.deque[tuple[Candidate, float | None]] = collections.deque(
            maxlen=self.config.population_size
        )
        self._best: tuple[int, Genome, float] | None = None
        self._rungs = Rungs(self.config.reduction_factor, self.config.rungs) if self.config.rungs > 1 else None
        self._released: list[int] = []  # ids whose checkpoints no promotion needs any more, not yet taken
        self._surrogate = Surrogate() if self.config.surrogate > 1 else None
        self._elite: list[tuple[Candidate, Values]] = []  # several objectives: NSGA-II's survivors
        self._ranked: list[tuple[Candidate, int, float]] | None = None  # the elite's fronts and crowding, cached
        self._seeds: collections.deque[Genome] = collections.deque()  # asked first (warm start)
        self._priors: collections.deque[Genome] = collections.deque(
            prior_genomes(space, problem) if self.config.priors and self.config.strategy == "evolution" else ())

    # --- state ---
    @property
    def best(self) -> tuple[int, Genome, float] | None:
        """(id, genome, fitness) of the best result told so far (first one on ties; of any rung, with rungs), None
        before any success."""
        return self._best

    def resumable(self) -> set[int]:
        """Multi-fidelity: the ids whose checkpoints a promotion may still need, or one asked and not told (whose
        task a job's end cancelled: a resumed run promotes its parent again)."""
        if self._rungs is None:
            return set()
        return self._rungs.held() | {c.parents[0] for c in self._pending.values() if c.origin == "promoted"}

    def released(self) -> list[int]:
        """Multi-fidelity: the ids whose checkpoints no promotion needs any more, since the last call."""
        out, self._released = self._released, []
        return out

    def forget(self, ids: Iterable[int]) -> None:
        """Multi-fidelity: these ids' checkpoints are gone (a resumed run found no file): they are not promoted."""
        if self._rungs is not None:
            self._rungs.forget(ids)

    @property
    def num_told(self) -> int:
        return len(self._told)

    @property
    def pending(self) -> tuple[int, ...]:
        """Ids asked but not yet told, oldest first."""
        return tuple(self._pending)

    def pending_parents(self) -> set[int]:
        """Parents of the children asked and not yet told: their weights must outlive their place in the population
        while a child that inherits them waits for a worker or trains (the run's kept weights include them)."""
        return set(self._pending_parents)

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
    def ask(self, promote: bool = True) -> Candidate:
        """The next candidate to evaluate: with rungs a promotion where there is one (:meth:`promotion`; not with
        `promote` false), else the seed genomes first, then random until ``population_size`` ids have been handed
        out (asked or reserved) and the population holds a tournament's worth of results, then bred (a share
        ``immigrants`` of them random): a job of W workers breeds a few dozen results in, not a population."""
        cid = self._next_id
        if promote and (candidate := self.promotion(cid)) is not None:
            self._next_id += 1
            self._pend(candidate)
            return candidate
        rng = random.Random(f"galapagos:{self.config.seed}:{cid}")
        random_phase = (
            self.config.strategy == "random"
            or self._next_id < self.config.population_size
            or len(self._elite if self.multi_objective else self._population)
            < min(self.config.tournament_size, self.config.population_size)
            or rng.random() < self.config.immigrants
        )
        if self._seeds:
            genome, parents, origin = self._seeds.popleft(), (), "seed"
        elif random_phase and (prior := self._prior()) is not None:
            genome, parents, origin = prior, (), "prior"
        else:
            bred = None if random_phase else self._best_bred(rng)
            genome, parents, origin = bred if bred is not None else (self._random(rng), (), "random")
        candidate = Candidate(id=cid, genome=genome, parents=parents, origin=origin)
        self._next_id += 1
        self._pend(candidate)
        return candidate

    def promotion(self, cid: int) -> Candidate | None:
        """With rungs: the best result that goes on to the next rung now (evolve/rungs.py), as candidate `cid`, which
        the caller asks (:meth:`ask`) or adopts; None if none does."""
        found = self._rungs.promote() if self._rungs is not None else None
        if found is None:
            return None
        rung, previous = found
        return Candidate(cid, previous.genome, (previous.id,), "promoted", previous.params, rung + 1)

    def adopt(self, candidate: Candidate) -> None:
        """Take a candidate bred elsewhere from a copy of this engine (evolve/ahead.py) as if asked here, in place of
        any pending one of its id (a child bred ahead whose id went to a promotion)."""
        self._unpend(candidate.id)
        if candidate.origin == "promoted" and self._rungs is not None:
            self._rungs.promoted(candidate.rung - 1, candidate.parents[0])
        if candidate.origin == "seed" and self._seeds:
            self._seeds.popleft()
        if candidate.origin == "prior":
            self._prior()
        self._next_id = max(self._next_id, candidate.id + 1)
        self._pend(candidate)

    def reserve(self, n: int) -> range:
        """`n` ids that no ask will give, for candidates drawn elsewhere (evolve/drawn.py) and adopted once their
        genome is known."""
        ids = range(self._next_id, self._next_id + n)
        self._next_id += n
        return ids

    def tell(self, candidate_id: int, fitness: float | None, status: str = "ok", values: Values | None = None
             ) -> None:
        """Report a result. Only a finished one (``status`` "ok" and a finite ``fitness``) joins the population;
        a pruned or failed one (timeout, NaN, crash: ``fitness`` None) stays out of it, though it counts as told
        and a pruned one's fitness as a result (``best``).
        With several objectives, ``values`` holds one per objective (:func:`objective_values`); None leaves the
        candidate out of the population."""
        candidate = self._unpend(candidate_id)
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
        ``fitness`` and ``status``; with several objectives also ``params`` and ``metrics`` (:class:`.pareto.Scored`);
        with rungs ``rung`` (None: the first).
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
            rung = getattr(rec, "rung", None) or 0
            candidate = self._unpend(cid) or Candidate(cid, genome, parents, origin, rung=rung)
            if origin == "promoted" and self._rungs is not None and parents:
                self._rungs.promoted(candidate.rung - 1, parents[0])
            self._seen.add(genome.key)
            self._next_id = max(self._next_id, cid + 1)
            values = objective_values(rec, self.config.objectives) if self.multi_objective else None
            self._record(candidate, rec.fitness, rec.status, values)
            applied += 1
        return applied

    def close(self) -> None:
        """Nothing to release (an :class:`evolve.ahead.Ahead` stops its helper)."""

    # --- internals ---
    def _pend(self, candidate: Candidate) -> None:
        self._pending[candidate.id] = candidate
        self._pending_parents.update(set(candidate.parents))
        self._seen.add(candidate.genome.key)

    def _unpend(self, candidate_id: int) -> Candidate | None:
        candidate = self._pending.pop(candidate_id, None)
        if candidate is not None:
            self._pending_parents.subtract(set(candidate.parents))
            for parent in [p for p in set(candidate.parents) if not self._pending_parents[p]]:
                del self._pending_parents[parent]
        return candidate

    def _record(self, candidate: Candidate, fitness: float | None, status: str, values: Values | None) -> None:
        value = _clean_fitness(fitness)
        self._told.add(candidate.id)
        finished = status == "ok" and value is not None
        if finished:
            if self.config.cost_aware and not self.multi_objective:
                if len(self._population) == self._population.maxlen:
                    self._costs.pop(self._population[0][0].id, None)  # ageing out
                self._costs[candidate.id] = count_params(candidate.genome, self.problem)
            self._population.append((candidate, value))
            if self._surrogate is not None and candidate.rung == 0:
                self._surrogate.add(candidate.genome, self._params(candidate), value)
            if self._rungs is not None:
                self._rungs.add(candidate.rung, candidate.id, value, candidate)
                self._released += self._rungs.take_released()
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
            cost = (lambda c: self._costs.get(c.id)) if self.config.cost_aware else None
            level = (lambda c: c.rung) if self._rungs is not None else None
            return select(self._population, k, self.config.tournament_size, rng, cost, self.config.cost_tolerance,
                          level)
        if self._ranked is None:
            self._ranked = nsga2_rank(self._elite, self.config.objectives)
        return crowded_tournament(self._ranked, k, self.config.tournament_size, rng)

    def _params(self, candidate: Candidate) -> int:
        return candidate.params if candidate.params is not None else count_params(candidate.genome, self.problem)

    def _best_bred(self, rng: random.Random) -> tuple[Genome, tuple[int, ...], str] | None:
        """A child (:meth:`_breed`); with a surrogate that has enough points, the best predicted of
        ``config.surrogate`` distinct children."""
        if self._surrogate is None or not self._surrogate.ready:
            return self._breed(rng)
        children: dict[str, tuple[Genome, tuple[int, ...], str]] = {}
        for _ in range(self.config.surrogate):
            if (child := self._breed(rng)) is not None:
                children.setdefault(child[0].key, child)
        return max(children.values(), default=None,
                   key=lambda c: self._surrogate.predict(c[0], count_params(c[0], self.problem)))

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
