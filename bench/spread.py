"""Step time of one 3D network spread data-parallel over g trainer children (run.spread) against one process.

    python -m bench.spread [--spreads 2] [--rounds 3] [--samples 128] [--size 32] [--batch 16] [--device cpu]

A CosmoFlow-like network (CosmoFlow's pattern of 3D convolutions each followed by a max pool, then dense layers and
four regression targets: here three 3x3x3 convolutions of 16, 32 and 64 channels, dense layers of 128 and 64, on a
32^3 input of four channels instead of 128^3) trained on random data as a worker rank trains it: launch/packing.py's
Pack with one Supervisor (the peer: one process with all the rank's cores as threads) or one Spread group of g
children (each with its share of the cores on the CPU, gloo; one GPU each with NCCL where `--device` names a GPU and
the machine has g).
The global batch is the same in every setting, as run.spread keeps it. A step's time is the wall time between the
leader's first and last epoch reports over the steps between them (the first epoch, with the start-up, is not
timed; the validation split is one batch). The settings take turns for `--rounds` rounds; the best round of each
is the figure where other work shares the machine (a process of several threads slows most when a core is taken),
the median beside it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from galapagos.launch.packing import Pack
from galapagos.launch.protocol import Result, Status, Task

TASK_FN = "bench.spread:train_steps"
LAYERS = [{"type": "conv", "channels": 16, "kernel": 3, "stride": 1, "act": "relu"},
          {"type": "pool", "op": "max", "size": 2},
          {"type": "conv", "channels": 32, "kernel": 3, "stride": 1, "act": "relu"},
          {"type": "pool", "op": "max", "size": 2},
          {"type": "conv", "channels": 64, "kernel": 3, "stride": 1, "act": "relu"},
          {"type": "pool", "op": "max", "size": 2},
          {"type": "dense", "units": 128, "act": "relu"},
          {"type": "dense", "units": 64, "act": "relu"}]


def train_steps(payload: dict, ctx) -> dict:
    """The bench's task function, run in each trainer child: the network trained on random cubes (made once per
    child, the same in every child); the leader's metrics carry the seconds per step."""
    import torch

    from galapagos.evolve.genome import Genome
    from galapagos.evolve.problem import Problem
    from galapagos.evolve.task import TrainConfig
    from galapagos.evolve.train import train_candidate

    n, size, batch = payload["samples"], payload["size"], payload["batch"]
    key = ("bench data", n, size)
    if key not in ctx.cache:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n + batch, 4, size, size, size, generator=gen)
        y = torch.stack([x.mean((1, 2, 3, 4)), x.std((1, 2, 3, 4)), x[:, 0].mean((1, 2, 3)),
                         x[:, 1].amax((1, 2, 3))], 1)
        ctx.cache[key] = {"train": (x[:n].to(ctx.device), y[:n].to(ctx.device)),
                          "val": (x[n:].to(ctx.device), y[n:].to(ctx.device))}
    genome = Genome.from_json({"layers": LAYERS, "optimizer": "adam", "lr": 1e-3, "batch_size": batch,
                               "weight_decay": 0.0, "head": "flatten"})
    times: list[float] = []

    def timed(metrics: dict) -> None:
        times.append(time.perf_counter())
        ctx.report(metrics)

    summary, _ = train_candidate(genome, Problem((4, size, size, size), "regression", 4), ctx.cache[key],
                                 TrainConfig(epochs=payload["epochs"]), device=ctx.device, report=timed)
    steps = (len(times) - 1) * (n // batch)  # none in a follower, which does not report
    return {"fitness": summary["fitness"],
            "metrics": {"step_seconds": (times[-1] - times[0]) / steps if steps else None}}


def worker(spread: int, device: str) -> Pack:
    """A worker rank's trainer children for run.spread = `spread` (1: one process with all the rank's cores)."""
    workers = Pack(0, TASK_FN)
    devices = (device,) if device == "cpu" else tuple(f"cuda:{i}" for i in range(spread))
    workers.place(TASK_FN, cores=sorted(os.sched_getaffinity(0)), device=devices[0], devices=devices, spread=spread)
    return workers


def step_seconds(workers: Pack, payload: dict, task_id: int) -> float:
    """Seconds per step of one task on `workers`."""
    events = workers.submit(Task(task_id, payload, None))
    while not any(isinstance(e, Result) for e in events):
        events = workers.poll(0.5)
    result = next(e for e in events if isinstance(e, Result))
    if result.status != Status.OK:
        raise RuntimeError(f"task {task_id}: {result.status}: {result.error}")
    return result.metrics["step_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spreads", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    payload = {"samples": args.samples, "size": args.size, "batch": args.batch, "epochs": args.epochs}
    cores = len(os.sched_getaffinity(0))
    settings = [1, *args.spreads]
    workers = {g: worker(g, args.device) for g in settings}
    times: dict[int, list[float]] = {g: [] for g in settings}
    try:
        for r in range(args.rounds):  # the settings take turns, so that a busy spell of the machine hits them alike
            for g in settings:
                times[g].append(step_seconds(workers[g], payload, r))
                print(f"# spread={g} round {r}: {times[g][-1]:.3f} s/step", flush=True)
    finally:
        for w in workers.values():
            w.stop()
    best, median = {g: min(t) for g, t in times.items()}, {g: statistics.median(t) for g, t in times.items()}
    print(f"| setting ({args.device}, {cores} cores, global batch {args.batch}, {args.size}^3 x 4) | processes | "
          f"seconds per step, best of {args.rounds} | median | vs one process (best; median) |")
    print("|---|---|---|---|---|")
    for g in settings:
        name = "one process, all cores" if g == 1 else f"run.spread = {g}"
        print(f"| {name} | {g} | {best[g]:.3f} | {median[g]:.3f} | {best[1] / best[g]:.2f}x; "
              f"{median[1] / median[g]:.2f}x |")

if __name__ == "__main__":
    main()
