"""Candidates per hour on one device: packed (run.pack = k trainer children at once) against one at a time.

    python -m bench.packing [--seconds 60] [--rounds 2] [--packs 2 4 auto] [--streams 4 8] [--epochs 2]
                            [--device cuda:0]

The worker side as a worker rank runs it (launch/packing.py's Pack: real trainer children under their Supervisors,
each task sent down its pipe, each Result read back), on this machine's first GPU or else its CPU cores. Two
kinds of small networks, each under 1 M parameters: 1D convolutions on the bundled signals example (1x128) and 2D
convolutions on the shapes example (1x16x16), six genomes each, cycled in the same order for every setting. Every
setting first runs one task per child (the children start, import torch, move the data to the device; "auto" sizes
itself here from its first candidate's measured memory), then keeps its children busy for `--seconds` of wall time;
the candidates that ended well in that window count, the ones still running are cancelled and do not. The peer is
one at a time (k = 1) in the same run, on the same tasks, for the same time. On a CPU-only machine "auto" is 1
(the placement already split the cores between the ranks): packing there shares the same cores among k children,
each with its share of them as threads.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from pathlib import Path

from galapagos.launch.packing import Pack
from galapagos.launch.placement import place
from galapagos.launch.protocol import Result, Status, Task

TASK_FN = "bench.packing:train_one"
KINDS = {  # kind -> (example module, the layers of its six genomes)
    "1d": ("signals", [[{"type": "conv", "channels": c, "kernel": k, "stride": 2, "act": "relu"},
                        {"type": "residual", "channels": c, "kernel": 3, "act": "relu"}]
                       for c in (32, 64, 128) for k in (5, 7)]),
    "2d": ("shapes", [[{"type": "conv", "channels": c, "kernel": 3, "stride": 1, "act": "relu"},
                       {"type": "residual", "channels": 2 * c, "kernel": 3, "act": "relu"}]
                      for c in (16, 32, 48) for _ in (0, 1)]),
}


def train_one(payload: dict, ctx) -> dict:
    """The bench's task function, run in a trainer child: one genome trained on a bundled example's file, which
    each child reads once."""
    import torch

    from galapagos.datashare.format import load
    from galapagos.evolve.genome import Genome
    from galapagos.evolve.problem import Problem
    from galapagos.evolve.task import TrainConfig
    from galapagos.evolve.train import train_candidate

    key = ("bench data", payload["data"])
    if key not in ctx.cache:
        info, arrays = load(payload["data"], ("train", "val"))
        ctx.cache[key] = (Problem(tuple(info.sample_shape), info.task, info.num_classes),
                          {s: (torch.from_numpy(x).to(ctx.device), torch.from_numpy(y).to(ctx.device))
                           for s, (x, y) in arrays.items()})
    problem, data = ctx.cache[key]
    genome = Genome.from_json({"layers": payload["layers"], "optimizer": "adam", "lr": 3e-3, "batch_size": 64,
                               "weight_decay": 0.0, "head": "avg"})
    config = TrainConfig(epochs=payload["epochs"], cuda_graphs=payload.get("graphs", True))
    summary, _ = train_candidate(genome, problem, data, config, device=ctx.device,
                                 seed=payload["seed"], report=ctx.report)
    return {"fitness": summary.pop("fitness"), "metrics": {"params": summary["params"]}}


def run_setting(pack: int | str, payloads: list[dict], seconds: float, device: str, cores: list[int]) -> dict:
    """Candidates that ended well in `seconds` of wall time with `pack` children busy, after a warm-up."""
    workers = Pack(0, TASK_FN)
    workers.place(TASK_FN, cores=cores, device=device, pack=pack)
    workers.attach(None)
    ids = iter(range(10**9))
    nth = [0]

    def send() -> None:
        i = next(ids)
        events.extend(workers.submit(Task(i, payloads[nth[0] % len(payloads)], 3600.0)))
        nth[0] += 1

    def results(until: float) -> list[Result]:
        out = [e for e in events if isinstance(e, Result)]
        events.clear()
        while time.time() < until and not out:
            out = [e for e in workers.poll(0.05) if isinstance(e, Result)]
        return out

    events: list = []
    try:
        for _ in range(2):  # warm-up: every child starts and trains once (an "auto" pack sizes itself in the first)
            sent = workers.capacity
            for _ in range(sent):
                send()
            done = 0
            while done < sent:
                done += len(results(time.time() + 600))
        nth[0] = 0  # the window's tasks: the same list from its start for every setting
        for _ in range(workers.capacity + 1):
            send()
        start = time.time()
        end, ok, params, errors = start + seconds, 0, [], []
        while time.time() < end:
            for r in results(end):
                if r.status == Status.OK and r.ended <= end:
                    ok += 1
                    params.append(r.metrics.get("params", 0))
                elif r.status != Status.OK:
                    errors.append(f"{r.status}: {r.error}")
                send()
        for task in workers.pending():
            workers.cancel(task.id, Status.CANCELLED)
        return {"pack": pack, "k": workers.capacity, "ok": ok, "per_hour": ok / seconds * 3600,
                "max_params": max(params, default=0), "failed": len(errors), "first_error": errors[:1]}
    finally:
        workers.stop()


def run_streams(k: int, payloads: list[dict], seconds: float, device: str) -> dict:
    """The other way to share a GPU: `k` candidates at once in this one process, a thread each on a CUDA stream of
    its own (torch's current stream is per thread), measured as run_setting measures the children. Without CUDA
    graphs: captures from several threads of one process at once break each other (torch's generator state cannot
    be registered during another thread's capture; the process aborts)."""
    import threading
    from types import SimpleNamespace

    import torch

    ctx = SimpleNamespace(cache={}, device=device, report=lambda metrics: None)
    payloads = [{**p, "graphs": False} for p in payloads]
    train_one(payloads[0], ctx)  # the data read and moved once, before the threads share the cache
    nth, ok, lock = [0], [], threading.Lock()

    def loop(until: float | None, warm: int) -> None:
        gpu = device.startswith("cuda")
        with torch.cuda.stream(torch.cuda.Stream(device)) if gpu else contextlib.nullcontext():
            while warm > 0 or (until is not None and time.time() < until):
                with lock:
                    payload = payloads[nth[0] % len(payloads)]
                    nth[0] += 1
                out = train_one(payload, ctx)
                if gpu:
                    torch.cuda.current_stream().synchronize()
                warm -= 1
                if until is not None and time.time() <= until:
                    ok.append(out["metrics"]["params"])

    def together(until: float | None, warm: int) -> None:
        threads = [threading.Thread(target=loop, args=(until, warm)) for _ in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    together(None, 2)  # warm-up: every thread trains twice
    nth[0] = 0
    together(time.time() + seconds, 0)  # a candidate still running at the end is not counted
    return {"pack": f"streams {k}", "k": k, "ok": len(ok), "per_hour": len(ok) / seconds * 3600,
            "max_params": max(ok, default=0)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="wall seconds each setting is measured")
    p.add_argument("--packs", nargs="+", default=["2", "4", "auto"], help="settings beside one at a time")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--streams", nargs="*", type=int, default=[],
                   help="also k candidates as threads of this process, each on a CUDA stream of its own on a GPU")
    p.add_argument("--no-graphs", action="store_true", help="train without CUDA graphs (train.cuda_graphs = false)")
    p.add_argument("--device", default=None, help="default: the placement's first device (a GPU, else cpu)")
    args = p.parse_args(argv)
    device = args.device or place(0, 1).device
    cores = sorted(os.sched_getaffinity(0))
    packs: list[int | str] = [1] + [int(k) if k.isdigit() else k for k in args.packs]
    packs += [f"streams {k}" for k in args.streams]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            module, genomes = KINDS[kind]
            path = Path(tmp) / f"{module}.h5"
            __import__(f"galapagos.examples.{module}", fromlist=["generate"]).generate(path, samples=2000)
            payloads = [{"data": str(path), "layers": g, "epochs": args.epochs, "seed": i, "graphs": not args.no_graphs}
                        for i, g in enumerate(genomes)]
            for r in range(args.rounds):  # the settings alternate, their order rotating: machine noise hits all
                for pack in packs[r % len(packs):] + packs[:r % len(packs)]:
                    if str(pack).startswith("streams"):
                        row = run_streams(int(pack.split()[1]), payloads, args.seconds, device)
                    else:
                        row = run_setting(pack, payloads, args.seconds, device, cores)
                    rows.append({"kind": kind, "round": r, **row})
                    print(f"# {kind} round {r} pack={pack}: {row}", flush=True)
    print(f"\nDevice: {device} ({len(cores)} cores), {args.seconds:g} s per setting and round, {args.rounds} rounds, "
          f"{args.epochs} epoch(s) per candidate\n")
    print("| network | run.pack | children | candidates/hour (mean of rounds) | rounds | vs one at a time | "
          "largest (params) |")
    print("|---|---|---|---|---|---|---|")
    mean = {}
    for kind in args.kinds:
        for pack in packs:
            mine = [r for r in rows if r["kind"] == kind and r["pack"] == pack]
            mean[kind, pack] = sum(r["per_hour"] for r in mine) / len(mine)
            ratio = mean[kind, pack] / mean[kind, 1] if mean[kind, 1] else float("nan")
            each = ", ".join(f"{r['per_hour']:.0f}" for r in mine)
            print(f"| {kind} | {pack} | {mine[-1]['k']} | {mean[kind, pack]:.0f} | {each} | {ratio:.2f}x | "
                  f"{max(r['max_params'] for r in mine):,} |")

if __name__ == "__main__":
    main()
