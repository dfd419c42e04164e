"""The end of the time budget. Finishing (`[evolution] finish`, galapagos/flows/finish.py): the last share of it
trains the best networks on from their weights, and the best of those is the run's. The plan's rules on records,
the config's checks, and a real run on MPI ranks. And the final ensemble's build inside the budget: the search
stops its expected seconds before the deadline."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import galapagos
from galapagos.config import Config, load_config
from galapagos.datashare.format import DatasetInfo
from galapagos.evolve.engine import Engine
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.problem import Problem
from galapagos.evolve.task import TrainConfig
from galapagos.examples import shapes
from galapagos.flows.evolution import build_share
from galapagos.flows.evolution_source import BUILD_RATE, BUILD_START_S, EvolutionSource, build_seconds
from galapagos.flows.finish import FINISH, SAFETY, Finish
from galapagos.launch.protocol import Progress, Result, Status
from galapagos.reports.progress import ProgressView
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir
from bench.build_reserve import measure
from tests.mpirun import describe_run, run_mpi
from tests.test_evolve_run import SMALL, journal


def record(cid: int, key: str, seconds: float, epochs: int = 2, origin: str = "mutation") -> JournalRecord:
    return JournalRecord(id=cid, genome={}, status="ok", fitness=0.9, curve=[0.5] * epochs, key=key, origin=origin,
                         start=100.0, end=100.0 + seconds)


def test_the_best_networks_not_finished_train_for_the_time_left():
    train = TrainConfig(epochs=2, inherited_epochs=1, inherit_shrink=0.5)
    finish = Finish(0.25, 400.0, deadline=1000.0, train=train, time_limit=1800.0)
    assert finish.start == 900.0 and not finish.begun(899.0) and finish.begun(900.0)
    best = [record(7, "a", seconds=4.0), record(3, "b", seconds=1.0), record(9, "c", seconds=50.0)]
    picked, trained = finish.next(best, now=900.0)
    assert picked.id == 7
    assert trained.epochs == int(SAFETY * 100 / 2.0) == 40  # 2 s an epoch in its own training, 100 s left
    assert trained.inherit_shrink == 1.0 and trained.inherited_epochs == 0  # its own weights, all its epochs
    picked, trained = finish.next(best, now=950.0)  # the next best: 0.5 s an epoch, 50 s left
    assert picked.id == 3 and trained.epochs == 80
    assert finish.next(best, now=950.0) is None and finish.over  # 25 s an epoch: not more than train.epochs
    finish = Finish(0.25, 400.0, deadline=1000.0, train=train, time_limit=1800.0)
    assert finish.next(best, now=900.0, end=960.0)[1].epochs == int(SAFETY * 60 / 2.0)  # the search ends at 960


def test_a_finished_network_is_not_finished_again():
    train = TrainConfig(epochs=2)
    done = record(12, "a", seconds=1.0, origin=FINISH)
    finish = Finish(0.5, 100.0, deadline=100.0, train=train, time_limit=1800.0, records=[done])
    assert finish.keys == {"a"}  # an earlier job's
    best = [done, record(4, "a", seconds=1.0), record(5, "b", seconds=1.0)]
    assert finish.next(best, now=50.0)[0].id == 5
    assert finish.next(best, now=50.0) is None
    assert Finish(0.0, 100.0, 100.0, train, 1800.0).start is None  # off
    assert Finish(0.5, 0.0, None, train, 1800.0).start is None  # no time budget


def test_the_task_timeout_caps_a_finishing_task():
    finish = Finish(0.9, 10_000.0, deadline=10_000.0, train=TrainConfig(epochs=2), time_limit=100.0)
    assert finish.next([record(1, "a", seconds=2.0)], now=1_000.0)[1].epochs == int(SAFETY * 100)


def test_finish_is_checked(tmp_path):
    assert Config.from_dict({"evolution": {"finish": 0.25}}).evolution.finish == 0.25
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="evolution.finish"):
            Config.from_dict({"evolution": {"finish": bad}})
    data = tmp_path / "shapes.h5"
    shapes.generate(data, samples=60, size=12, seed=0)
    with pytest.raises(ValueError, match="evolution.finish = 0.25: a share of the time budget, and the run has none"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, set={"evolution.finish": 0.25})
    assert not (tmp_path / "run").exists()


def _trained(source: EvolutionSource, task_id: int, fitness: float, weights: bytes | None) -> None:
    """A worker's two epochs and result, with the weights it saved in models/, as a trainer writes them (None: a
    task of one's own that saves none)."""
    for epoch in (1, 2):
        source.on_progress(Progress(task_id, 1, {"epoch": epoch, "fitness": fitness, "loss": 1.0 - fitness}))
    if weights is not None:
        path = Path(source.run.model_path(task_id))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(weights)
    now = time.time()
    source.on_result(Result(task_id, 1, "nodeA", Status.OK, fitness, now - 1.0, now, {"val_loss": 0.5}, None))


def test_a_finished_best_below_the_kept_top_keeps_its_weights(tmp_path):
    """A finished network is the run's best even below the search's best by validation, so with one network kept
    (run.keep_models = 1) its weights are kept as the best's: best/ holds them, not its parent's."""
    config = load_config(None, ["run.keep_models=1", "run.prune=false", "run.budget_minutes=20", "train.epochs=2",
                                "evolution.finish=0.25"])
    run = RunDir.open(tmp_path / "run", resume=False)
    problem = Problem((3, 8, 8), "classification", 4)
    source = EvolutionSource(Engine(config.space, problem, config.evolution), config, run, problem,
                             view=ProgressView(), deadline=time.time() + 1200)
    searched = [source.next_task(), source.next_task()]
    for t, fitness in zip(searched, (0.9, 0.5)):
        _trained(source, t.id, fitness, b"searched")
    source.finish.start = time.time()  # the budget's last quarter begins
    task = source.next_task()
    assert source.inflight[task.id]["origin"] == FINISH and source.inflight[task.id]["inherits"] == searched[0].id
    _trained(source, task.id, 0.8, b"finished")  # below its parent, the one network the top keeps
    source.sweep()
    assert source.best.id == task.id and Path(run.model_path(task.id)).exists()
    assert NetworkDir(run.best).model_file.read_bytes() == b"finished"
    os.remove(run.model_path(task.id))  # weights gone: best/ is left without any, not with another network's
    run.save_network(run.best, source.best, {})
    assert not NetworkDir(run.best).model_file.exists()
    run.close()


@pytest.mark.mpi
def test_the_run_ends_with_its_best_networks_trained_on(tmp_path):
    data, out = tmp_path / "shapes.h5", tmp_path / "run"
    shapes.generate(data, samples=400, size=12, seed=1)
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", data, "--out", out, "--budget-minutes", 0.6,
                       *SMALL, "--set", "evolution.finish=0.5", "--set", "run.keep_models=30"], timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    records = journal(out)
    by_id = {r["id"]: r for r in records}
    finished = [r for r in records if r["origin"] == FINISH]
    searched = [r for r in records if r["origin"] != FINISH]
    assert finished and len(by_id) == len(records)  # ids of their own
    for r in finished:
        parent = by_id[r["parents"][0]]
        assert parent["origin"] != FINISH and parent["status"] == "ok" and r["key"] == parent["key"]
        assert r["inherits"] == parent["id"] and r["genome"] == parent["genome"]
        assert r["status"] == "ok" and len(r["curve"]) > 2  # longer than [train] epochs
    assert len({r["key"] for r in finished}) == len(finished)
    assert min(r["id"] for r in finished) > max(r["id"] for r in searched)  # the search stopped breeding
    ok = [r for r in finished if r["status"] == "ok"]
    best = max(ok, key=lambda r: r["fitness"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best"]["id"] == best["id"]
    assert summary["best"]["finished"] == {"from": best["parents"][0], "epochs": len(best["curve"])}
    assert f"finished: evaluation {best['parents'][0]}'s network trained on for" in proc.stdout
    assert json.loads((out / "best" / "metrics.json").read_text())["id"] == best["id"]
    assert "finishing: the search stops breeding" in proc.stdout + proc.stderr
    # the search left the final ensemble's build its expected seconds, as bench/build_reserve.py estimates them
    # from the journal afterwards
    reserved = summary["build_reserve"]
    assert reserved > BUILD_START_S and measure(out)["estimate_s"] == pytest.approx(reserved, abs=0.11)

    # a longer budget for the same run: the resumed job is all finishing (the first job searched 18 s and finished
    # for most of the next 18: past the new budget's first 27 s), and it finishes kept networks the first job did
    # not (30 kept: more than the finished networks and their parents), under ids of their own
    first = {r["id"] for r in records}
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", data, "--out", out, "--resume",
                       "--set", "run.budget_minutes=0.9"], timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    new = [r for r in journal(out) if r["id"] not in first]
    assert new and all(r["origin"] == FINISH for r in new) and min(r["id"] for r in new) > max(first)
    assert not {r["key"] for r in new} & {r["key"] for r in finished}
    assert json.loads((out / "summary.json").read_text())["best"]["finished"]


def test_the_final_pick_chooses_among_the_finished_networks(tmp_path):
    from galapagos.flows.final_pick import candidates

    run = RunDir(tmp_path)
    records = [record(1, "a", 1.0), record(2, "b", 1.0), record(3, "a", 1.0, origin=FINISH)]
    records = [r.replace(fitness=f) for r, f in zip(records, (0.95, 0.9, 0.8))]
    os.makedirs(os.path.dirname(run.model_path(1)))
    for r in records:
        open(run.model_path(r.id), "wb").close()
    assert [r.id for r in candidates(run, records, 5)] == [3]  # the finished one, though below its parent
    assert [r.id for r in candidates(run, records[:2], 5)] == [1, 2]  # none finished: the search's best


def test_the_search_ends_early_enough_for_the_final_ensemble_s_build(tmp_path):
    """The search's end is the deadline less the build's expected seconds, from the kept networks' training: it
    moves when a network enters the kept top and stays when one does not. A task that saves no weights leaves
    nothing to build: the search has the whole budget."""
    config = load_config(None, ["run.keep_models=2", "run.prune=false", "train.epochs=2"])
    run = RunDir.open(tmp_path / "run", resume=False)
    problem = Problem((3, 8, 8), "classification", 4)
    deadline = time.time() + 1200

    def source(share: float, deadline: float | None) -> EvolutionSource:
        return EvolutionSource(Engine(config.space, problem, config.evolution), config, run, problem,
                               view=ProgressView(), deadline=deadline, build_share=share)

    unsaved = source(0.5, deadline)
    for t in (unsaved.next_task(), unsaved.next_task()):
        _trained(unsaved, t.id, 0.7, None)
    assert len(unsaved.top) == 2 and unsaved.end() == deadline
    s = source(0.5, deadline)
    assert s.end() == deadline  # nothing kept yet
    tasks = [s.next_task() for _ in range(3)]
    for t, fitness in zip(tasks, (0.6, 0.9, 0.5)):
        _trained(s, t.id, fitness, b"w")  # 1 s over 2 epochs each
    kept = [t[2] for t in s.top]
    assert [r.id for r in kept] == [tasks[1].id, tasks[0].id]  # the third is below the kept two: no change
    assert build_seconds(kept, 0.5) == BUILD_START_S + BUILD_RATE * 0.5 * 2 * 0.5
    assert s.end() == pytest.approx(deadline - build_seconds(kept, 0.5))
    assert source(0.0, deadline).end() == deadline  # no final ensemble: the search has the whole budget
    assert source(0.5, None).end() is None  # no time budget
    run.close()


def test_the_build_s_share_counts_the_samples_it_predicts():
    def info(**splits):
        return DatasetInfo("d.h5", "classification", 4, 1, (1, 8), 1, "float32", splits)
    config = load_config(None, ["run.val_fraction=0.2"])
    assert build_share(config, info(train=3000, val=1000, test=1000)) == pytest.approx(2000 / 3000)
    assert build_share(config, info(train=1000, test=500)) == pytest.approx((200 + 500) / 800)  # val carved
    assert build_share(load_config(None, ["run.final_ensemble=false"]), info(train=10, val=5, test=5)) == 0.0


def test_the_build_s_bench_names_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no summary.json"):
        measure(tmp_path)
