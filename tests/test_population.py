"""Population and tournament sizes that follow the job, breeding that starts a few dozen results into a large job,
and parents whose weights outlive their place in the population while a child of theirs is pending."""
from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest

from galapagos.config import load_config
from galapagos.evolve.check import check_genome
from galapagos.evolve.engine import AUTO, Candidate, Engine, EvolutionConfig
from galapagos.evolve.operators import POPULATION_CAP, auto_population, auto_tournament
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.flows.evolution_source import EvolutionSource
from galapagos.launch.protocol import Result, Status
from galapagos.reports.progress import ProgressView
from galapagos.store.rundir import RunDir
from tests.test_engine import synthetic_fitness
from tests.test_evolve_run import SMALL, galapagos, journal, shapes_file  # noqa: F401 - fixture

SPACE = SearchSpace(channels=(4, 8, 16), units=(8, 16, 32), max_layers=8)
IMAGE = Problem((3, 8, 8), "classification", 4)
BRED = ("mutation", "crossover")


# --- the rule ---
@pytest.mark.parametrize("workers, population, tournament", [
    (1, 16, 4), (8, 16, 4), (16, 16, 4), (100, 100, 10), (1000, 1000, 32), (4096, 4096, 64),
    (27_648, POPULATION_CAP, 64), (127_488, POPULATION_CAP, 64)])
def test_auto_sizes_follow_the_workers(workers, population, tournament):
    cfg = EvolutionConfig().sized(workers)
    assert (cfg.population_size, cfg.tournament_size) == (population, tournament)
    assert Engine(SPACE, IMAGE, workers=workers).config == cfg
    assert cfg.sized(5) == cfg  # resolved sizes are integers: a resumed run on another job size keeps them


def test_an_explicit_size_wins_and_the_other_follows_it():
    assert EvolutionConfig(population_size=8).sized(1000).population_size == 8
    assert EvolutionConfig(population_size=8).sized(1000).tournament_size == auto_tournament(8) == 3
    assert EvolutionConfig(tournament_size=7).sized(1000) == EvolutionConfig(population_size=1000, tournament_size=7)
    assert EvolutionConfig(tournament_size=40).sized(1).population_size == 40  # room for the tournament
    assert EvolutionConfig(population_size=2).sized(1).tournament_size == 2
    with pytest.raises(ValueError, match="workers"):
        EvolutionConfig().sized(0)


def test_the_tournament_keeps_the_takeover_time_of_16_and_4():
    """ln P / ln S, the generations tournament selection alone takes to fill the population with its best, stays
    near 2 from 16 to the cap; a fixed 4 would take 6 at 4,096."""
    for workers in (16, 64, 256, 1000, 4096):
        p = auto_population(workers)
        assert 1.8 < math.log(p) / math.log(auto_tournament(p)) < 2.2


def test_auto_is_a_config_value():
    config = load_config(None, ["evolution.population_size=\"auto\"", "evolution.tournament_size=5"])
    assert (config.evolution.population_size, config.evolution.tournament_size) == (AUTO, 5)
    assert config.evolution.sized(1).population_size == 16


# --- the random start is as short as the job allows ---
def _random_candidate(engine: Engine, cid: int) -> Candidate:
    rng = random.Random(cid)
    while True:
        genome = check_genome(engine.space.random_genome(rng, engine.problem), engine.problem, engine.space)
        if genome.key not in engine._seen:
            return Candidate(cid, genome)


def _tells_until_bred(engine: Engine, inflight: list[Candidate], limit: int = 1000) -> int:
    """Tell the oldest in flight and ask one more, as the master does when a worker finishes; the number of tells
    before the first bred child."""
    for told in range(1, limit + 1):
        c = inflight.pop(0)
        engine.tell(c.id, synthetic_fitness(c.genome))
        asked = engine.ask()
        if asked.origin in BRED:
            assert set(asked.parents) <= {i for i in range(asked.id)} and len(engine.population) >= 32
            return told
        inflight.append(asked)
    raise AssertionError(f"nothing bred in {limit} tells")


def test_a_thousand_workers_breed_a_few_dozen_results_in():
    """1,000 in flight: the first 1,000 asks are necessarily random (nothing is told), then breeding starts once
    the population holds a tournament's worth (32), not after a whole population of 1,000 results."""
    engine = Engine(SPACE, IMAGE, EvolutionConfig(immigrants=0.0), workers=1000)
    inflight = [engine.ask() for _ in range(1000)]
    assert all(c.origin in ("prior", "random") for c in inflight)
    told = _tells_until_bred(engine, inflight)
    assert 32 <= told <= 40, told
    for _ in range(200):  # from then on every ask breeds (no immigrants)
        c = inflight.pop(0)
        engine.tell(c.id, synthetic_fitness(c.genome))
        assert engine.ask().origin in BRED


def test_a_first_round_drawn_by_the_workers_counts_as_asked():
    """A job that breeds ahead reserves its first round's ids for the workers to draw (evolve/drawn.py) and adopts
    each when its result comes back: those count towards the random start too."""
    engine = Engine(SPACE, IMAGE, EvolutionConfig(immigrants=0.0, priors=False), workers=1000)
    drawn = engine.reserve(1000)
    told = 0
    for cid in drawn:
        engine.adopt(_random_candidate(engine, cid))
        engine.tell(cid, 0.5)
        told += 1
        if engine.ask().origin in BRED:
            break
    assert 32 <= told <= 40, told


# --- a pending child keeps its parents ---
def test_pending_parents_outlive_the_population():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=2, tournament_size=2, immigrants=0.0))
    first = [engine.ask(), engine.ask()]
    for c in first:
        engine.tell(c.id, 0.1)
    child = engine.ask()
    assert child.origin in BRED and engine.pending_parents() == set(child.parents)
    others = [engine.ask(), engine.ask()]
    for c in others:  # two newer results push the first two out of the population
        engine.tell(c.id, 0.9)
    assert not set(child.parents) & {c.id for c, _ in engine.population}
    assert engine.pending_parents() == set(child.parents)  # still needed: the child has not been told
    engine.tell(child.id, None, "failed")
    assert engine.pending_parents() == set()


def test_pending_parents_count_each_child():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=1, tournament_size=1, immigrants=0.0))
    parent = engine.ask()
    engine.tell(parent.id, 0.5)
    a, b = engine.ask(), engine.ask()
    assert a.parents == b.parents == (parent.id,)
    engine.tell(a.id, 0.4)
    assert engine.pending_parents() == {parent.id}  # b still needs it
    engine.tell(b.id, 0.3)
    assert engine.pending_parents() == set()


def _source(tmp_path) -> EvolutionSource:
    config = load_config(None, ["run.evaluations=50", "run.keep_models=1", "run.prune=false",
                                "evolution.population_size=2", "evolution.tournament_size=2",
                                "evolution.immigrants=0.0", "evolution.priors=false"])
    run = RunDir.open(tmp_path / "run", resume=False)
    return EvolutionSource(Engine(config.space, IMAGE, config.evolution), config, run, IMAGE, view=ProgressView())


def _finish(source: EvolutionSource, task_id: int, fitness: float) -> None:
    """A worker's result, with the weights it saved (a real file in models/, as the trainer writes it)."""
    path = Path(source.run.model_path(task_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    now = time.time()
    source.on_result(Result(task_id, 1, "nodeA", Status.OK, fitness, now - 1.0, now, {"val_loss": 0.5}, None))


def test_the_run_keeps_a_parent_s_weights_while_its_child_waits(tmp_path):
    """The population ages its parent out while the child is queued: the weights it will load stay in models/
    until it is told, then go."""
    source = _source(tmp_path)
    first = [source.next_task(), source.next_task()]
    for t in first:
        _finish(source, t.id, 0.1 + 0.1 * t.id)
    child = source.next_task()
    parent = source.inflight[child.id]["inherits"]
    assert child.payload.inherit == str(source.run.model_path(parent))
    newer = [source.next_task(), source.next_task()]
    for t in newer:
        _finish(source, t.id, 0.9)
    assert parent not in {c.id for c, _ in source.engine.population} and parent not in {t[1] for t in source.top}
    source.sweep()  # what the run does once a second (EvolutionSource.sweep)
    source.run.close()  # the weights dropped so far deleted (off rank 0's path, store/reaper.py)
    assert Path(source.run.model_path(parent)).exists() and parent in source.held  # the queued child needs it
    _finish(source, child.id, 0.5)
    source.sweep()
    source.run.close()
    assert not Path(source.run.model_path(parent)).exists() and parent not in source.held


@pytest.mark.mpi
def test_no_child_of_a_real_run_loses_its_parent_s_weights(shapes_file, tmp_path):  # noqa: F811
    """Three workers with a task queued on each and a population of 2: parents age out while their children wait.
    Every child that was to inherit did (without the pending parents in the kept set, about half lost them)."""
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 30, "--workers", 3, *SMALL,
                     "--set", "evolution.population_size=2", "--set", "evolution.tournament_size=2",
                     "--set", "evolution.immigrants=0.0", "--set", "run.prefetch=1", "--set", "run.prune=false",
                     "--set", "run.keep_models=1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    heirs = [r for r in journal(out) if "inherits" in r]
    assert len(heirs) >= 10
    assert [r["id"] for r in heirs if "inherited" not in r["metrics"]] == []
    kept = {int(p.stem) for p in (out / "models").glob("*.pt")}
    assert len(kept) <= 2 + 1  # the run's end leaves the population's and the best's, nothing pending


def test_a_cancelled_child_keeps_nothing_at_the_end_of_a_job(tmp_path):
    """The end of a job cancels what runs; the engine is never told of those children, but nothing is in flight
    any more, so the run's end prunes their parents' weights (a resumed run breeds afresh)."""
    source = _source(tmp_path)
    for t in [source.next_task(), source.next_task()]:
        _finish(source, t.id, 0.1 + 0.1 * t.id)
    child = source.next_task()
    parent = source.inflight[child.id]["inherits"]
    for t in [source.next_task(), source.next_task()]:
        _finish(source, t.id, 0.9)
    assert parent in source.kept()
    now = time.time()
    source.on_result(Result(child.id, 1, "nodeA", Status.CANCELLED, None, now - 1.0, now, {}, None))
    assert parent in source.engine.pending_parents() and not source.inflight
    assert parent not in source.kept()
