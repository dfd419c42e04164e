"""Spreading (launch/spread.py, evolve/distributed.py): one candidate trained data-parallel by a group of trainer
children (gloo on the CPU here) gives the one-process training's losses and weights, saves them in the same files,
fails as one when a child dies, stops as one when pruned; run.spread reaches the workers from the command line, for
evolution and ensemble members alike; the memory estimate that decides run.spread = "auto" matches what a CPU step
holds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from galapagos.evolve.distributed import estimate_memory
from galapagos.evolve.genome import Genome
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.problem import Problem
from galapagos.evolve.task import TrainConfig, TrainTask
from galapagos.evolve.train import train_task
from galapagos.launch.packing import Pack
from galapagos.launch.placement import Gpu, Topology, place
from galapagos.launch.protocol import Progress, Result, Status, Task
from galapagos.launch.spread import Spread, spread_width
from galapagos.launch.supervisor import Supervisor
from tests.mpirun import describe_run

TASK_FN = "tests.test_spread:trained"
PROBLEM = Problem((1, 8, 8), "classification", 3)
GENOME = Genome.from_json({"layers": [{"type": "conv", "channels": 6, "kernel": 3, "stride": 1, "act": "relu"},
                                      {"type": "dense", "units": 16, "act": "relu"}],
                           "optimizer": "sgd", "lr": 3e-2, "batch_size": 30, "weight_decay": 0.0, "head": "avg"})


def blobs(rows: int = 307) -> dict[str, np.ndarray]:
    """Three classes of 8x8 images, as the trainer child's shared arrays; 307 rows: a last batch of 7, which two
    children split 3 and 4 (a weighting that is off shows in the weights: SGD, unlike Adam, keeps the gradient's
    scale)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, rows + 60)
    x = (rng.normal(size=(rows + 60, 1, 8, 8)) + y.reshape(-1, 1, 1, 1)).astype(np.float32)
    return {"train/x": x[:rows], "train/y": y[:rows], "val/x": x[rows:], "val/y": y[rows:]}


def trained(task: TrainTask, ctx) -> dict:
    """The trainer children's task: Galapagos's own, on the arrays above (this file's tests share no data)."""
    ctx.data = ctx.data or blobs()
    return train_task(task, ctx)


def fails_in_follower(task: TrainTask, ctx) -> dict:
    """A task whose second child runs out of memory at once, while the leader waits for it in the first step."""
    from galapagos.evolve.distributed import Group

    if Group.current().rank == 1:
        raise MemoryError("the follower's device is full")
    return trained(task, ctx)


class Here:
    """A trainer child's context, in this process: the one-device reference."""

    def __init__(self):
        self.data, self.device, self.cache, self.reports = blobs(), "cpu", {}, []

    def report(self, metrics: dict) -> None:
        self.reports.append(metrics)


def group(spread: int = 2, task_fn: str = TASK_FN) -> Pack:
    workers = Pack(1, task_fn)
    workers.place(task_fn, cores=sorted(os.sched_getaffinity(0)), spread=spread)
    return workers


def until_result(workers: Pack, seconds: float = 120.0, on_progress=None) -> tuple[list[Progress], Result]:
    progress: list[Progress] = []
    for _ in range(int(seconds / 0.05)):
        for ev in workers.poll(0.05):
            if isinstance(ev, Result):
                return progress, ev
            progress.append(ev)
            if on_progress is not None:
                on_progress(ev)
    raise AssertionError(f"no result within {seconds} s; progress {progress}")


def test_two_processes_train_as_one_and_save_weights_the_loader_reads_alike(tmp_path):
    task = TrainTask(GENOME, PROBLEM, TrainConfig(epochs=2), seed=3, save=str(tmp_path / "spread.pt"))
    here = Here()
    alone = train_task(TrainTask(GENOME, PROBLEM, TrainConfig(epochs=2), seed=3, save=str(tmp_path / "one.pt")), here)
    workers = group()
    try:
        assert isinstance(workers.children[0], Spread) and workers.capacity == 1
        workers.submit(Task(1, task, 120.0))
        progress, result = until_result(workers)
    finally:
        workers.stop()
    assert result.status == Status.OK, result
    assert [p.metrics["epoch"] for p in progress] == [1, 2]  # the leader's reports only, one per epoch
    for spread, one in zip(progress, here.reports):
        assert spread.metrics["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
        assert spread.metrics["val_loss"] == pytest.approx(one["val_loss"], rel=1e-4)
    assert result.fitness == pytest.approx(alone["fitness"], abs=1e-6)
    nets = {}
    for name in ("spread", "one"):
        NetworkDir(tmp_path / name).write(GENOME, {"problem": PROBLEM.to_dict()}, weights_from=tmp_path / f"{name}.pt")
        nets[name], _, _ = NetworkDir(tmp_path / name).load()
    x = torch.from_numpy(blobs()["val/x"])
    with torch.no_grad():
        torch.testing.assert_close(nets["spread"](x), nets["one"](x), rtol=1e-4, atol=1e-4)
    one = nets["one"].state_dict()
    for k, a in nets["spread"].state_dict().items():
        torch.testing.assert_close(a, one[k], rtol=1e-4, atol=1e-5, msg=k)


def test_a_killed_child_fails_the_task_and_the_next_task_trains(tmp_path):
    long = TrainTask(GENOME, PROBLEM, TrainConfig(epochs=200), seed=1)
    workers = group()
    spread = workers.children[0]
    try:
        workers.submit(Task(1, long, 120.0))
        follower = None

        def kill(_):
            nonlocal follower
            if follower is None:
                follower = spread.children[1].proc.pid
                os.kill(follower, signal.SIGKILL)

        _, result = until_result(workers, on_progress=kill)
        assert result.status == Status.CRASHED and "spread member 1 of 2" in result.error, result
        assert "killed by SIGKILL" in result.error
        assert not workers.busy
        workers.submit(Task(2, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=1), seed=2), 120.0))
        _, after = until_result(workers)
        assert after.status == Status.OK and after.id == 2, after
        assert spread.children[1].proc.pid != follower  # a new child took the dead one's place
    finally:
        workers.stop()


def test_a_follower_out_of_memory_is_the_task_s_failure_not_the_leader_s_lost_peer():
    workers = group(task_fn="tests.test_spread:fails_in_follower")
    try:
        workers.submit(Task(1, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=1), seed=1), 120.0))
        _, result = until_result(workers)
    finally:
        workers.stop()
    assert result.status == Status.OOM, result
    assert result.error.startswith("spread member 1 of 2 on cpu: MemoryError: the follower's device is full"), result


def test_a_task_every_child_fails_alike_ends_with_the_leader_s_error_and_frees_the_group():
    workers = group(task_fn="tests.test_spread:no_such_function")
    try:
        workers.submit(Task(1, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=1), seed=1), 120.0))
        _, result = until_result(workers)
        assert result.status == Status.FAILED and "no_such_function" in result.error, result
        assert not result.error.startswith("spread member") and workers.children[0].current is None
    finally:
        workers.stop()


def test_a_pruned_candidate_stops_the_whole_group_at_the_same_epoch():
    workers = group()
    spread = workers.children[0]
    try:
        workers.submit(Task(1, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=200), seed=1), 120.0))
        pids = [c.proc.pid for c in spread.children]
        progress, result = until_result(workers, on_progress=lambda p: workers.cancel(1, Status.PRUNED))
        assert result.status == Status.PRUNED and result.fitness == progress[0].metrics["fitness"], result
        for _ in range(200):  # the follower ends on its own, told by the leader: not killed
            if spread.current is None:
                break
            workers.poll(0.05)
        assert spread.current is None and [c.proc.pid for c in spread.children] == pids
        assert all(c.alive() for c in spread.children)
    finally:
        workers.stop()


def test_a_group_past_its_time_limit_ends_as_one_child_does():
    workers = group()
    try:
        workers.submit(Task(1, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=500), seed=1), 3.0))
        _, result = until_result(workers)
        assert result.status == Status.TIMEOUT and "time limit" in result.error, result
        for _ in range(100):  # its follower, past the same limit, is ended too
            if workers.children[0].current is None:
                break
            workers.poll(0.05)
        assert workers.children[0].current is None and not workers.busy
    finally:
        workers.stop()


def test_a_diverging_candidate_ends_as_nan_in_every_child_at_once():
    """The loss checks sum over the group: every child finds the non-finite loss at the same batch, none waits in
    a collective for one that stopped."""
    wild = Genome.from_json({**GENOME.to_json(), "optimizer": "sgd", "lr": 1e30})
    workers = group()
    spread = workers.children[0]
    try:
        workers.submit(Task(1, TrainTask(wild, PROBLEM, TrainConfig(epochs=3, grad_clip=0.0), seed=1), 120.0))
        pids = [c.proc.pid for c in spread.children]
        _, result = until_result(workers)
        assert result.status == Status.NAN, result
        for _ in range(200):
            if spread.current is None:
                break
            workers.poll(0.05)
        assert spread.current is None and [c.proc.pid for c in spread.children] == pids  # none killed
    finally:
        workers.stop()


def test_auto_trains_a_candidate_that_fits_on_the_leader_alone():
    """run.spread = "auto": the leader estimates the candidate's memory and tells the group through its store; one
    that fits (any, off a GPU) trains as a one-device candidate while the others wait for the next task."""
    spread = Spread(Supervisor(1, TASK_FN), ("cpu", "cpu"), True, TASK_FN)
    spread.place(TASK_FN, cores=sorted(os.sched_getaffinity(0)))
    try:
        events = spread.submit(Task(1, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=1), seed=3), 120.0))
        for _ in range(2400):
            if result := next((e for e in events if isinstance(e, Result)), None):
                break
            events = spread.poll(0.05)
        assert result is not None and result.status == Status.OK and result.metrics["spread"] == 1, result
        alone = train_task(TrainTask(GENOME, PROBLEM, TrainConfig(epochs=1), seed=3), Here())
        assert result.fitness == alone["fitness"] and result.metrics["train_loss"] == alone["metrics"]["train_loss"]
    finally:
        spread.stop()


def test_a_rank_owns_the_gpus_no_other_worker_of_its_node_takes():
    four = Topology(gpus=(Gpu(),) * 4)
    assert place(0, 1, allowed=[0, 1], topology=four).devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3")
    assert [place(i, 2, allowed=[0, 1], topology=four).devices for i in (0, 1)] == [("cuda:0", "cuda:1"),
                                                                                   ("cuda:2", "cuda:3")]
    assert place(5, 8, allowed=[0, 1], topology=four).devices == ("cuda:1",)  # ranks share GPUs: one each
    assert place(0, 1, allowed=[0, 1], topology=Topology()).devices == ("cpu",)


def _galapagos(args: list, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "galapagos.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)


def test_evolve_and_ensemble_with_run_spread_two_train_each_candidate_on_two_children(tmp_path):
    """`--set run.spread=2` reaches the one worker: its candidates and ensemble members each train in a group of
    two trainer children (the second one's log is there), and the results are those of a one-device run."""
    from galapagos.examples import shapes

    data, run, ens = tmp_path / "d.h5", tmp_path / "run", tmp_path / "ens"
    shapes.generate(data, samples=120, size=12, seed=1)
    small = ["--set", "run.spread=2", "--set", "train.epochs=1", "--workers", "1"]
    proc = _galapagos(["evolve", "--data", data, "--out", run, "--evaluations", "3", *small,
                       "--set", "evolution.population_size=3"], tmp_path)
    assert proc.returncode == 0, describe_run(proc)
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["status"] == "ok" and r["metrics"]["spread"] == 2 for r in records), records
    assert (run / "log" / "trainer-1.spread1.log").exists()
    NetworkDir(run / "best").load()
    proc = _galapagos(["ensemble", "--run", run, "--data", data, "--out", ens, "--members", "2", *small], tmp_path)
    assert proc.returncode == 0, describe_run(proc)
    assert (ens / "log" / "trainer-1.spread1.log").exists()
    members = [json.loads(line) for line in next(ens.glob("*.jsonl")).read_text().splitlines()]
    assert len(members) == 2 and all(m["status"] == "ok" and m["metrics"]["spread"] == 2 for m in members), members


def test_the_estimate_is_what_a_cpu_training_step_holds():
    """Parameters, gradients and Adam's two moments exactly; the activations within a fifth of the bytes autograd
    saves in a real forward pass on the CPU."""
    problem = Problem((1, 8, 8, 8), "regression", 2)
    genome = Genome.from_json({"layers": [{"type": "conv", "channels": 8, "kernel": 3, "stride": 1, "act": "relu"},
                                          {"type": "pool", "op": "max", "size": 2},
                                          {"type": "conv", "channels": 16, "kernel": 3, "stride": 1, "act": "relu"}],
                               "optimizer": "adam", "lr": 1e-3, "batch_size": 16, "weight_decay": 0.0,
                               "head": "flatten"})
    est = estimate_memory(genome, problem, 16)
    from galapagos.evolve.build import build_model

    model = build_model(genome, problem)
    storages: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def keep(t):
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = model(torch.randn(16, *problem.sample_shape))
    opt = torch.optim.Adam(model.parameters())
    out.square().mean().backward()
    opt.step()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    assert est.parameters == size and est.gradients == sum(p.grad.nbytes for p in model.parameters())
    assert est.optimizer == sum(s[k].nbytes for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    assert 0.8 * sum(storages.values()) <= est.activations <= 1.25 * sum(storages.values())
    assert estimate_memory(genome, problem, 64).activations == pytest.approx(4 * est.activations, rel=0.05)


def test_auto_spreads_a_candidate_too_slow_for_its_time_limit_on_one_device():
    """run.spread = "auto" also spreads a candidate whose training on one device, projected from a few timed steps
    over its epochs and the training split's batches, would pass half its time limit (launch/spread.py: too_slow).
    On the CPU here: no limit, or hours, and it stays; a limit no step fits in, and it spreads."""
    from types import SimpleNamespace

    from galapagos.launch.spread import TIME_SHARE, too_slow

    ctx = SimpleNamespace(device="cpu", data=blobs())
    task = TrainTask(GENOME, PROBLEM, TrainConfig(epochs=2))
    assert not too_slow(task, ctx, None) and not too_slow(task, ctx, 3600.0)
    assert too_slow(task, ctx, 1e-6) and TIME_SHARE == 0.5
    lost = SimpleNamespace(device="cpu", data={})  # no training split to count (streamed): trained on one device
    assert not too_slow(task, lost, 1e-6)


def test_the_width_follows_the_devices_a_rank_owns():
    assert spread_width(1, ("cuda:0", "cuda:1"), 1) == 1
    assert spread_width("auto", ("cuda:0", "cuda:2"), 1) == 2
    assert spread_width(4, ("cuda:0", "cuda:2"), 1) == 2  # no more than it owns
    assert spread_width(2, ("cuda:0",), 1) == 1  # one device: off
    assert spread_width(2, ("cpu",), 1) == 2  # the CPU: each child a share of the cores
    assert spread_width("auto", ("cpu",), 1) == 1


@pytest.mark.gpu
def test_a_candidate_spreads_over_two_gpus_with_nccl(gpu_env, tmp_path):
    """On a machine with two GPUs or more: a one-worker evolution with run.spread = 2 trains every candidate on
    two of them (NCCL)."""
    from galapagos.launch.placement import read_topology

    if len(read_topology(env=gpu_env).gpus) < 2:
        pytest.skip("spreading needs two GPUs")
    from galapagos.examples import shapes

    data, run = tmp_path / "d.h5", tmp_path / "run"
    shapes.generate(data, samples=120, size=12, seed=1)
    env = {**gpu_env, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-m", "galapagos.cli", "evolve", "--data", data, "--out", run,
                           "--evaluations", "2", "--workers", "1", "--set", "run.spread=2", "--set", "train.epochs=1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" for r in records) and (run / "log" / "trainer-1.spread1.log").exists()
