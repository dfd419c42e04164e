"""Median stopping in the evolution run's master side (galapagos.flows.evolution.EvolutionSource.on_progress), driven
through its public methods as the master loop drives it."""
from __future__ import annotations

import time

import pytest

from galapagos.config import load_config
from galapagos.evolve.engine import Engine
from galapagos.evolve.problem import Problem
from galapagos.flows.evolution_source import EvolutionSource
from galapagos.launch.protocol import Progress, Result, Status, Task
from galapagos.reports.progress import ProgressView
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

BASE = ["run.evaluations=20", "run.prune_min_results=3", "run.prune_after=2", "train.epochs=6"]


def make_source(tmp_path, *sets: str) -> EvolutionSource:
    config = load_config(None, [*BASE, *sets])
    problem = Problem((3, 8, 8), "classification", 4)
    run = RunDir.open(tmp_path / "run", resume=False)
    engine = Engine(config.space, problem, config.evolution)
    return EvolutionSource(engine, config, run, problem, view=ProgressView())


def task(source: EvolutionSource) -> Task:
    t = source.next_task()
    assert isinstance(t, Task)
    return t


def report(source: EvolutionSource, t: Task, curve: list[float], rank: int = 1) -> list:
    """One Progress per epoch, as a worker streams them; the decisions on_progress returned."""
    return [source.on_progress(Progress(t.id, rank, {"epoch": e, "fitness": f, "loss": 1.0 - f}))
            for e, f in enumerate(curve, 1)]


def result(source: EvolutionSource, t: Task, status: Status, fitness: float | None, rank: int = 1,
           error: str | None = None) -> None:
    now = time.time()
    source.on_result(Result(t.id, rank, "nodeA", status, fitness, now - 2.0, now, {"val_loss": 0.5}, error))


def finish(source: EvolutionSource, curve: list[float]) -> Task:
    """A candidate that trains to the end and finishes OK with the best of its curve."""
    t = task(source)
    report(source, t, curve)
    result(source, t, Status.OK, max(curve))
    return t


def journal(source: EvolutionSource) -> list[JournalRecord]:
    return source.run.read_journal()


# Three finished candidates whose best-so-far at every epoch is 0.3, 0.5 and 0.7: the median is 0.5.
PEERS = ([0.3] * 6, [0.5] * 6, [0.7] * 6)


def with_peers(tmp_path, *sets: str, peers=PEERS) -> EvolutionSource:
    source = make_source(tmp_path, *sets)
    for curve in peers:
        finish(source, list(curve))
    return source


def test_nothing_is_pruned_before_enough_candidates_have_finished(tmp_path):
    source = make_source(tmp_path)
    for curve in PEERS[:2]:
        finish(source, list(curve))
    hopeless = task(source)
    assert report(source, hopeless, [0.0] * 5) == [None] * 5  # only two finished: no median to trust yet
    finish(source, list(PEERS[2]))  # the third
    late = task(source)
    assert report(source, late, [0.0, 0.0]) == [None, Status.PRUNED]


def test_nothing_is_pruned_before_prune_after_epochs(tmp_path):
    source = with_peers(tmp_path, "run.prune_after=3")
    t = task(source)
    assert report(source, t, [0.0, 0.0, 0.0]) == [None, None, Status.PRUNED]


def test_below_the_median_is_pruned_above_it_goes_on(tmp_path):
    source = with_peers(tmp_path)
    low, high, equal = task(source), task(source), task(source)
    assert report(source, low, [0.4, 0.45]) == [None, Status.PRUNED]
    assert report(source, high, [0.6, 0.65, 0.6, 0.55, 0.6]) == [None] * 5
    assert report(source, equal, [0.5, 0.5]) == [None, None]  # at the median is not below it


def test_the_best_so_far_counts_not_the_last_epoch(tmp_path):
    source = with_peers(tmp_path)
    t = task(source)
    assert report(source, t, [0.6, 0.1, 0.2]) == [None, None, None]  # a dip after a good epoch is forgiven


def test_the_median_is_taken_per_epoch(tmp_path):
    # peers start low and climb: at epoch 2 their median is 0.2, at epoch 4 it is 0.8
    rising = [[0.1, 0.2, 0.5, 0.8, 0.9, 0.9]] * 3
    source = with_peers(tmp_path, peers=rising)
    t = task(source)
    assert report(source, t, [0.3, 0.3, 0.6, 0.7]) == [None, None, None, Status.PRUNED]


def test_never_pruned_at_the_final_epoch(tmp_path):
    # peers leap at the last epoch: a steady 0.2 is above their median at epochs 2..5, below it at epoch 6
    late_bloomers = [[0.1] * 5 + [0.9]] * 3
    source = with_peers(tmp_path, peers=late_bloomers)
    t = task(source)
    assert report(source, t, [0.2] * 6) == [None] * 6
    result(source, t, Status.OK, 0.2)
    # the same candidate in a run with one more epoch is pruned at epoch 6
    (tmp_path / "longer").mkdir()
    longer = with_peers(tmp_path / "longer", "train.epochs=7", peers=late_bloomers)
    t2 = task(longer)
    assert report(longer, t2, [0.2] * 6) == [None] * 5 + [Status.PRUNED]


def test_prune_false_disables_it(tmp_path):
    source = with_peers(tmp_path, "run.prune=false")
    t = task(source)
    assert report(source, t, [0.0] * 5) == [None] * 5


def test_failed_candidates_are_not_peers(tmp_path):
    source = make_source(tmp_path)
    for curve in PEERS[:2]:
        finish(source, list(curve))
    broken = task(source)
    report(source, broken, [0.9, 0.9])
    result(source, broken, Status.FAILED, None, error="RuntimeError: boom")
    t = task(source)
    assert report(source, t, [0.0] * 5) == [None] * 5  # still only two finished candidates


def test_progress_without_a_fitness_or_for_an_unknown_task_is_ignored(tmp_path):
    source = with_peers(tmp_path)
    t = task(source)
    assert source.on_progress(Progress(t.id, 1, {"epoch": 1, "loss": 3.0})) is None
    assert source.on_progress(Progress(t.id, 1, {"epoch": 1, "fitness": None})) is None
    assert source.on_progress(Progress(12345, 1, {"epoch": 2, "fitness": 0.0})) is None
    # the metrics without a fitness did not count as epochs: epoch 1 is still to come
    assert report(source, t, [0.0, 0.0]) == [None, Status.PRUNED]


def test_a_pruned_result_is_journalled_as_pruned(tmp_path):
    source = with_peers(tmp_path)
    t = task(source)
    assert report(source, t, [0.41, 0.4]) == [None, Status.PRUNED]
    result(source, t, Status.PRUNED, 0.41, rank=2)
    records = journal(source)
    assert len(records) == 4
    last = records[-1]
    assert last.id == t.id and last.status == "pruned"
    assert last.fitness == pytest.approx(0.41)
    assert last.curve == pytest.approx([0.41, 0.4])
    assert last.rank == 2 and last.host == "nodeA"
    assert [r.status for r in records[:3]] == ["ok", "ok", "ok"]
    shown = source.snapshot()
    assert shown.done == 4
    assert shown.by_status == {"ok": 3, "pruned": 1}  # pruning is not a failure
    assert shown.best == pytest.approx(0.7)  # nor a new best


def test_a_cancelled_task_is_not_journalled(tmp_path):
    source = with_peers(tmp_path)
    t = task(source)
    report(source, t, [0.9])
    result(source, t, Status.CANCELLED, None)
    assert [r.id for r in journal(source)] == [0, 1, 2]
    assert source.snapshot().done == 3 and not source.finished()


def _asked(source: EvolutionSource, inheriting: bool) -> Task:
    """The next task that does (or does not) start from a parent's weights; others stay pending."""
    for _ in range(200):
        t = task(source)
        if ("inherits" in source.inflight[t.id]) == inheriting:
            return t
    raise AssertionError(f"no {'inheriting' if inheriting else 'fresh'} task in 200 asks")


def test_fresh_and_inheriting_candidates_are_judged_against_their_own_kind(tmp_path):
    # three fresh peers (median 0.5), then half the asks are random immigrants, half children that inherit
    source = with_peers(tmp_path, "evolution.population_size=3", "evolution.tournament_size=2",
                        "evolution.immigrants=0.5")
    child = _asked(source, inheriting=True)
    assert report(source, child, [0.1, 0.1]) == [None, None]  # no inheriting peer has finished: not judged yet
    result(source, child, Status.OK, 0.1)
    for _ in range(3):  # inheriting peers start where their parents ended: their median is 0.9
        t = _asked(source, inheriting=True)
        report(source, t, [0.9] * 6)
        result(source, t, Status.OK, 0.9)
    fresh, child = _asked(source, inheriting=False), _asked(source, inheriting=True)
    assert report(source, fresh, [0.6, 0.6, 0.6]) == [None, None, None]  # above the fresh median, not pruned
    assert report(source, child, [0.6, 0.6]) == [None, Status.PRUNED]  # below its own kind's
    records = {r.id: r for r in journal(source)}
    assert all(records[i].inherits is not None for i in records if records[i].curve == [0.9] * 6)


def test_the_running_median_is_the_median_of_everything_added():
    import random
    import statistics

    from galapagos.flows.evolution_source import Median

    rng = random.Random(3)
    for values in ([0.5], [0.2, 0.9], [rng.choice([0.1, 0.5, 0.5, 0.9]) for _ in range(101)],
                   [rng.random() for _ in range(1000)]):
        m = Median()
        for i, v in enumerate(values, 1):
            m.add(v)
            assert len(m) == i and m.median() == statistics.median(values[:i])
