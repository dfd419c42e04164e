"""The GPU path, on a machine with a GPU (skipped elsewhere): the rest of the suite runs on the CPU there too
(tests/conftest.py), so these tests are where candidates train on a GPU: mixed precision, channels-last, and a
whole evolution whose trainer children run on it."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.mpirun import REPO
from tests.test_evolve_run import SMALL, journal, shapes_file  # noqa: F401 - a fixture

pytestmark = pytest.mark.gpu
# as tests/conftest.py reads it: importing that module here would hide the GPUs again in the children that import this
ALL_ON_GPUS = os.environ.get("GALAPAGOS_TEST_GPUS", "") == "1"


def child_training(device: str | None = None) -> None:
    """Run in a process of its own: one 2D and one 3D candidate on this process's GPU (or `device`), each with the
    default layout ("auto": channels-last for 2D there) and the contiguous one; their summaries as one JSON line."""
    from galapagos.evolve.problem import Problem
    from galapagos.evolve.train import TrainConfig, train_candidate
    from galapagos.launch.placement import place
    from tests.test_train import blobs, genome

    device = device or place(0, 1).device
    layers = [{"type": "conv", "channels": 8, "kernel": 3, "stride": 1, "act": "relu"},
              {"type": "residual", "channels": 16, "kernel": 3, "act": "relu"}]
    out = {"device": device}
    for shape in ((1, 8, 8), (1, 6, 6, 6)):
        data = {"train": blobs(256, shape, 3), "val": blobs(64, shape, 3, seed=1)}
        for setting in ("auto", "contiguous"):
            summary, _ = train_candidate(genome(layers, lr=1e-2), Problem(shape, "classification", 3), data,
                                         TrainConfig(epochs=3, memory_format=setting), device=device)
            out[f"{len(shape) - 1}d {setting}"] = summary
    print(json.dumps(out))


def child_graphs() -> None:
    """Run in a process of its own, on this process's GPU: a candidate with batch norm and dropout trained eagerly
    and with `train.cuda_graphs`; a graphed network's outputs and gradients against its eager ones, on two batches;
    and a network that syncs with the host in its forward, which cannot be captured. The results as one JSON line."""
    import torch

    from galapagos.evolve.build import build_model
    from galapagos.evolve.problem import Problem
    from galapagos.evolve.steps import graphed
    from galapagos.evolve.train import TrainConfig, train_candidate
    from galapagos.launch.placement import place
    from tests.test_train import blobs, genome

    device = torch.device(place(0, 1).device)
    if device.type != "cuda":
        print(json.dumps({"skip": f"CUDA graphs need a CUDA or ROCm GPU, not {device}"}))
        return
    problem = Problem((1, 8, 8), "classification", 3)
    layers = [{"type": "conv", "channels": 8, "kernel": 3, "stride": 1, "act": "relu"},
              {"type": "norm", "kind": "batch"}, {"type": "residual", "channels": 16, "kernel": 3, "act": "relu"},
              {"type": "dense", "units": 16, "act": "relu"}, {"type": "dropout", "rate": 0.2}]
    data = {"train": blobs(300, (1, 8, 8), 3), "val": blobs(64, (1, 8, 8), 3, seed=1)}  # 9 full batches and 12 rows
    out = {}
    for on in (False, True):
        reports = []
        summary, _ = train_candidate(genome(layers, lr=1e-2), problem, data, TrainConfig(epochs=3, cuda_graphs=on),
                                     device=device, report=reports.append)
        out[f"graphs {on}"] = {**summary, "losses": [r["train_loss"] for r in reports]}
    torch.cuda.empty_cache()  # what the graphs' private pool held, once they are gone
    out["graph memory left"] = sum(s["total_size"] for s in torch.cuda.memory._snapshot()["segments"]
                                   if tuple(s["segment_pool_id"]) != (0, 0))

    model = build_model(genome(layers[:3]), problem).to(device).train()
    buffers = [b.clone() for b in model.buffers()]
    net = graphed(model, data["train"][0][:32].to(device), None)
    out["buffers kept"] = all(torch.equal(a, b) for a, b in zip(buffers, model.buffers()))
    worst = 0.0
    for rows in (slice(0, 32), slice(32, 64)):
        x = data["train"][0][rows].to(device)
        results = []
        for f in (net, model):
            model.zero_grad(set_to_none=True)
            y = f(x)
            (y * torch.arange(3, device=device)).sum().backward()
            results.append([y.detach().clone()] + [p.grad.clone() for p in model.parameters()])
        worst = max(worst, *((a - b).abs().max().item() / (b.abs().max().item() + 1e-6) for a, b in zip(*results)))
    out["graphed vs eager"] = worst

    class Syncs(torch.nn.Module):  # looks at a value on the host in its forward: no capture can hold that
        def __init__(self):
            super().__init__()
            self.lin, self.norm = torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2)

        def forward(self, x):
            return self.norm(self.lin(x)) * (2.0 if x.sum().item() > 0 else 1.0)

    syncs = Syncs().to(device)
    out["syncing network captured"] = graphed(syncs, torch.ones(8, 4, device=device), torch.bfloat16) is not None
    out["syncing network's buffers kept"] = bool(torch.equal(syncs.norm.running_mean, torch.zeros(2, device=device)))
    out["then trains eagerly"] = float(syncs(torch.ones(8, 4, device=device)).sum().item())
    print(json.dumps(out))


def child_warm() -> None:
    """A trainer child started before its rank is placed, then placed on this process's GPU: whether CUDA was up
    before its first task touched anything (launch.protocol.TrainerDevice)."""
    from galapagos.launch.placement import place
    from galapagos.launch.protocol import Result, Task
    from galapagos.launch.supervisor import Supervisor

    device = place(0, 1).device
    s = Supervisor(1, "tests.faulty_tasks:device_state")
    try:
        s.start()
        s.place("tests.faulty_tasks:device_state", device=device)
        s.submit(Task(1, None))
        result = next(ev for _ in range(600) for ev in s.poll(0.1) if isinstance(ev, Result))
    finally:
        s.stop()
    print(json.dumps({"placed": device, **result.metrics}))


def _python(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)


def test_candidates_train_on_the_gpu_in_mixed_precision_and_channels_last(gpu_env):
    if not ALL_ON_GPUS:  # the session's default: its processes see no GPU
        hidden = _python(["-c", "from galapagos.launch.placement import place; print(place(0, 1).device)"], dict(os.environ))
        assert hidden.returncode == 0 and hidden.stdout.strip() == "cpu", hidden.stderr
    proc = _python(["-c", "from tests.test_gpu import child_training; child_training()"], gpu_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["device"].startswith(("cuda:", "xpu:")), out
    for dims, fmt in (("2d", "channels_last"), ("3d", None)):  # 3D: contiguous, faster there (evolve/train.py)
        auto, plain = out[f"{dims} auto"], out[f"{dims} contiguous"]
        assert auto.get("memory_format") == fmt and "memory_format" not in plain
        assert auto["precision"] in ("bfloat16", "float16") and plain["precision"] == auto["precision"]
        assert auto["fitness"] > 0.6 and plain["fitness"] > 0.6  # both learn the blobs
        assert auto["val_loss"] == pytest.approx(plain["val_loss"], rel=0.25)  # the same training, other rounding


def test_an_evolution_trains_its_candidates_on_the_gpu(gpu_env, shapes_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    proc = _python(["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--evaluations", 4,
                    "--workers", 2, *SMALL], gpu_env)
    assert proc.returncode == 0, proc.stderr
    records = journal(out)
    assert len(records) == 4 and all(r["status"] in ("ok", "pruned") for r in records), records
    assert {r["metrics"].get("precision") for r in records if r["status"] == "ok"} <= {"bfloat16", "float16"}
    assert any(r["metrics"].get("precision") for r in records)  # mixed precision: only on a GPU


def test_a_trainer_child_starts_cuda_before_its_first_task(gpu_env):
    proc = _python(["-c", "from tests.test_gpu import child_warm; child_warm()"], gpu_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["placed"].startswith("cuda:"):
        pytest.skip(f"CUDA only, not {out['placed']}")
    assert out["device"] == out["placed"] and out["cuda_up"] is True, out  # up before the task touched the GPU


def test_cuda_graphs_replay_each_step_as_its_eager_one(gpu_env):
    """`train.cuda_graphs` on a CUDA GPU: the candidate trains as the eager one does (other rounding, other dropout
    draws), the replayed forward and backward give the eager outputs and gradients on new batches, the capture leaves
    the batch-norm statistics alone, and a network that cannot be captured trains eagerly instead."""
    proc = _python(["-c", "from tests.test_gpu import child_graphs; child_graphs()"], gpu_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in out:
        pytest.skip(out["skip"])
    eager, graphs = out["graphs False"], out["graphs True"]
    assert graphs["cuda_graphs"] is True and "cuda_graphs" not in eager
    assert out["graph memory left"] == 0  # freed when the candidate ended, not at some later garbage collection
    assert eager["fitness"] > 0.6 and graphs["fitness"] > 0.6
    assert graphs["losses"][-1] == pytest.approx(eager["losses"][-1], rel=0.5, abs=0.05)
    assert out["buffers kept"] and out["graphed vs eager"] < 1e-2, out  # the same arithmetic; a wrong replay is O(1)
    assert out["syncing network captured"] is False and out["syncing network's buffers kept"], out
    assert "could not be captured" in proc.stderr and math.isfinite(out["then trains eagerly"])  # CUDA still works
