"""Packing (launch/packing.py): one worker rank trains several candidates at once on its device, the master counts
its capacity in candidates (slots.Slots), a candidate that ran out of memory beside others runs again alone.

The MPI jobs are this file run as a script under real MPI (`python tests/test_packing.py MODE DIR PACK`): rank 0
serves a fixed list of tasks, the worker rank runs them in real trainer children."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from galapagos.config import RunConfig
from galapagos.evolve.errors import ConfigError
from galapagos.launch.packing import PACK_MAX, auto_capacity, out_of_memory
from galapagos.launch.protocol import Result, Status
from galapagos.launch.slots import Slots
from tests.mpirun import describe_run, run_mpi

TASKS = {"noted": "tests.faulty_tasks:noted", "oom": "tests.faulty_tasks:oom_when_crowded"}


class Listed:
    """A TaskSource of fixed payloads; task 1 is pruned at its third epoch in mode `noted`."""

    def __init__(self, payloads: dict, prune: int | None = None):
        self.payloads, self.prune, self.results, self.next = payloads, prune, [], iter(sorted(payloads))

    def next_task(self):
        from galapagos.launch.protocol import Task

        i = next(self.next, None)
        return None if i is None else Task(i, self.payloads[i], 60.0)

    def finished(self):
        return len(self.results) == len(self.payloads)

    def on_result(self, result):
        self.results.append(result)

    def on_progress(self, progress):
        return Status.PRUNED if progress.id == self.prune and progress.metrics.get("epoch", 0) >= 3 else None

    def on_tick(self, state):
        pass


def payloads(mode: str, where: str) -> dict:
    if mode == "noted":  # task 1 reports until pruned; the others hold their child a second
        return {i: {"dir": where, "seconds": 1.0, "reporters": [1]} for i in range(1, 6)}
    # task 1 runs out of memory beside task 2 only; task 3 beside task 4, and alone again
    return {1: {"dir": where, "seconds": 0.5, "victim": 1}, 2: {"dir": where, "seconds": 2.0},
            3: {"dir": where, "seconds": 0.5, "victim": 3, "always": True}, 4: {"dir": where, "seconds": 2.0}}


def serve(mode: str, where: str, pack: str) -> None:
    """Run as a script under MPI: rank 0 serves the mode's tasks, every other rank is a worker."""
    import galapagos.launch.session as session
    from galapagos.launch.mpi import world
    from galapagos.launch.protocol import Setup

    comm = world()
    if comm.rank != 0:
        session.worker_main(comm)
        return
    source = Listed(payloads(mode, where), prune=1 if mode == "noted" else None)
    state = session.master_run(comm, Setup(TASKS[mode], pack=int(pack) if pack.isdigit() else pack), source,
                               prefetch=0)
    print(json.dumps({"capacity": state.slots.capacity(1), "results": [
        {"id": r.id, "status": str(r.status), "metrics": r.metrics, "error": r.error, "started": r.started,
         "ended": r.ended} for r in source.results]}), flush=True)


def job(mode: str, tmp_path: Path, pack: str = "2", env: dict | None = None) -> dict:
    proc = run_mpi(2, [__file__, mode, tmp_path, pack], timeout=180, env=env, abort_on_error=False,
                   whole_env=env is not None)
    assert proc.returncode == 0, describe_run(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def notes(where: Path) -> dict[int, tuple[float, float, int]]:
    """task id -> (start, end, trainer pid), from what `noted` wrote."""
    out = {}
    for path in where.glob("task-*"):
        i, start, end, pid = path.read_text().split()
        out[int(i)] = (float(start), float(end) if end != "running" else float("inf"), int(pid))
    return out


def test_a_worker_of_capacity_two_trains_two_candidates_at_once_and_prunes_one_alone(tmp_path):
    out = job("noted", tmp_path)
    results = {r["id"]: r for r in out["results"]}
    assert sorted(r["id"] for r in out["results"]) == [1, 2, 3, 4, 5]  # every id once: the budget reached
    assert out["capacity"] == 2
    assert results[1]["status"] == "pruned"
    assert all(results[i]["status"] == "ok" for i in (2, 3, 4, 5)), results
    seen = notes(tmp_path)
    seen[1] = (seen[1][0], results[1]["ended"], seen[1][2])  # pruned: it wrote no end
    # the pruned task's partner went on in its own child and ended well after the prune
    assert seen[2][1] > results[1]["ended"] and seen[1][2] != seen[2][2]
    overlaps = [(a, b) for a in seen for b in seen if a < b and seen[a][0] < seen[b][1] and seen[b][0] < seen[a][1]]
    assert overlaps, seen
    assert not [i for i in seen if sum(seen[j][0] <= seen[i][0] < seen[j][1] for j in seen) > 2], seen  # at most 2


def test_an_out_of_memory_beside_others_is_retried_alone_once(tmp_path):
    out = job("oom", tmp_path)
    results = {r["id"]: r for r in out["results"]}
    assert sorted(results) == [1, 2, 3, 4]
    assert results[1]["status"] == "ok" and results[1]["metrics"].get("retried_alone") == 1, results[1]
    assert results[2]["status"] == "ok" and results[1]["started"] >= results[2]["ended"] - 0.5  # alone, after 2
    assert results[3]["status"] == "oom" and results[3]["metrics"].get("retried_alone") == 1, results[3]
    assert "run again alone: torch" in results[3]["error"] and "OutOfMemoryError" in results[3]["error"]
    assert results[4]["status"] == "ok"


def test_a_cpu_worker_with_pack_auto_trains_one_at_a_time(tmp_path):
    out = job("noted", tmp_path, "auto")
    assert out["capacity"] == 1
    assert sorted(r["id"] for r in out["results"]) == [1, 2, 3, 4, 5]


def test_evolve_with_run_pack_two_trains_two_candidates_at_once(tmp_path):
    """The command line's run.pack reaches the workers: `galapagos evolve --workers 1 --set run.pack=2` overlaps
    two candidates on its one worker and reaches its budget, every id once."""
    import os
    import subprocess

    from galapagos.examples import shapes

    data, out, notes_dir = tmp_path / "d.h5", tmp_path / "run", tmp_path / "notes"
    shapes.generate(data, samples=120, size=12, seed=1)
    notes_dir.mkdir()
    env = {**os.environ, "GALAPAGOS_TEST_NOTES": str(notes_dir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "galapagos.cli", "evolve", "--data", data, "--out", out,
                           "--evaluations", "8", "--workers", "1", "--set", "run.pack=2", "--set",
                           'run.task="tests.faulty_tasks:noting"', "--set", "evolution.population_size=4"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    ids = [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(ids) == list(range(8)), ids
    spans = sorted(tuple(map(float, p.read_text().split())) for p in notes_dir.iterdir())
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans  # two ran at once
    summary = json.loads((out / "summary.json").read_text())  # utilization counts the rank's two candidate slots
    assert summary["workers"] == 1 and summary["slots"] == 2 and 0 < summary["worker_utilization"] <= 1, summary


@pytest.mark.gpu
def test_a_gpu_worker_packs_itself_with_pack_auto(tmp_path, gpu_env):
    out = job("noted", tmp_path, "auto", env=gpu_env)
    assert out["capacity"] > 1, out
    measured = [r for r in out["results"] if "gpu_peak_bytes" in r["metrics"]]
    assert measured and all(r["metrics"]["gpu_free_bytes"] > 0 for r in measured)
    assert sorted(r["id"] for r in out["results"]) == [1, 2, 3, 4, 5]


def test_a_task_waiting_for_a_free_child_is_cancelled_at_once_and_the_running_one_goes_on():
    from galapagos.launch.packing import Pack
    from galapagos.launch.protocol import Task

    workers = Pack(1, "tests.faulty_tasks:sleeper")
    workers.place("tests.faulty_tasks:sleeper", pack=1)
    try:
        events = workers.submit(Task(1, 1.0)) + workers.submit(Task(2, 1.0))
        events += workers.cancel(2, Status.PRUNED)
        assert [(e.id, e.status) for e in events if isinstance(e, Result)] == [(2, Status.PRUNED)]
        assert [t.id for t in workers.pending()] == [1]
        for _ in range(1200):
            events = [e for e in workers.poll(0.05) if isinstance(e, Result)]
            if events:
                break
        assert [(e.id, e.status) for e in events] == [(1, Status.OK)] and not workers.busy
    finally:
        workers.stop()


def test_slots_give_a_rank_of_capacity_k_up_to_k_running_tasks():
    slots = Slots()
    slots.add(1, 2)
    slots.add(2)
    picks = []
    for _ in range(3):
        rank = slots.least_loaded(0)
        slots.change(rank, 1)
        picks.append(rank)
    assert sorted(picks) == [1, 1, 2] and slots.least_loaded(0) is None and slots.busy == 2
    assert slots.least_loaded(1) in (1, 2)  # one queued beyond what each runs
    slots.add(2, 3)  # a capacity announced again: what it holds is kept
    assert slots.held[2] == 1 and slots.least_loaded(0) == 2
    slots.change(1, -2)
    assert slots.busy == 1 and slots.held == {1: 0, 2: 1}
    slots.remove(2)
    assert slots.busy == 0 and slots.least_loaded(0) == 1


def test_auto_capacity_follows_memory_cores_and_the_cap():
    gib = 1 << 30
    assert auto_capacity(8 * gib, 40 * gib, 16) == 1 + 3  # 0.8 of 40 GiB free over 8 GiB * 1.25 + 0.5 GiB each
    assert auto_capacity(1 << 20, 80 * gib, 16) == PACK_MAX
    assert auto_capacity(1 << 20, 80 * gib, 3) == 3
    assert auto_capacity(60 * gib, 10 * gib, 16) == 1


def test_out_of_memory_is_read_from_the_status():
    import torch

    from galapagos.launch.trainer import status_of

    status = status_of(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert out_of_memory(Result(1, 1, "h", status, None, 0.0, 1.0))
    assert not out_of_memory(Result(1, 1, "h", Status.FAILED, None, 0.0, 1.0))


@pytest.mark.parametrize("value, words", [(-1, 'at least 1, or "auto"'), ("many", "expected an integer"),
                                          (1.5, "expected an integer")])
def test_run_pack_is_checked(value, words):
    with pytest.raises(ConfigError, match="run.pack") as err:
        RunConfig.from_dict({"pack": value})
    assert words in str(err.value)
    assert RunConfig.from_dict({"pack": "auto"}).packing == "auto" and RunConfig.from_dict({"pack": 3}).packing == 3


if __name__ == "__main__":
    serve(*sys.argv[1:4])
