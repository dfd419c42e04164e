"""Ensemble inference throughput: the MPI-averaged ensemble on 1, 2 and 4 ranks, against the one-rank average.

    python -m bench.ensemble_predict --members 8 --samples 4000 --ranks 1 2 4

A synthetic ensemble (random conv nets from the search space, `examples.random_ensemble`) on shapes images. Each
rank count runs under `mpiexec -n R` and times, inside the job, from after every rank loaded its members (and rank 0
the split) to rank 0 holding the averaged predictions, after a one-batch warm-up. R = 1 is the one-process
average with all cores to torch's own threads: the peer the speedup is measured against. The ideal speedup is
min(R, members) on a machine with a core (or GPU) per rank; "balance" (mean / max of the ranks' time in forward
passes) shows how evenly the round-robin deal spread members of unequal cost. Every R must give the same
predictions (checked; the run fails otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


class _Timed:
    """A member whose forward passes are timed: a rank's busy time shows how evenly the members are spread."""

    def __init__(self, model):
        self.model, self.seconds = model, 0.0

    def __call__(self, x):
        t0 = time.perf_counter()
        out = self.model(x)
        self.seconds += time.perf_counter() - t0
        return out


def _inner(ens: str, data: str, batch: int, out: str, repeats: int) -> None:
    from galapagos.ensemble.average import average
    from galapagos.flows.prediction import load_members
    from galapagos.launch.mpi import world

    world_comm = world()
    comm = world_comm if world_comm.size > 1 else None
    manifest, models, device, read = load_members(ens, comm, "test", data)
    models = [(i, _Timed(m)) for i, m in models]
    weights, problem = [m.weight for m in manifest.used], manifest.problem
    x = read[1] if read else None

    def run(xs):
        return average(comm, models, weights, xs, problem.task, problem.num_outputs, batch=batch, device=device)

    run(x[:batch] if x is not None else None)  # warm-up: kernels, allocator, first Bcast/Reduce
    times, busy = [], []
    for _ in range(repeats):
        for _, m in models:
            m.seconds = 0.0
        world_comm.Barrier()
        t0 = time.perf_counter()
        avg = run(x)
        times.append(time.perf_counter() - t0)
        busy.append(world_comm.gather({i: m.seconds for i, m in models}, root=0))
    if world_comm.rank == 0:
        np.savez(out, mean=avg.mean, members=avg.members)
        k = int(np.argmin(times))
        per_rank = [sum(b.values()) for b in busy[k] if b]  # ranks that hold members
        print(json.dumps({"ranks": world_comm.size, "samples": len(x), "seconds": round(times[k], 3),
                          "samples_per_s": round(len(x) / times[k], 1), "times": [round(t, 3) for t in times],
                          "busy_s": [round(b, 3) for b in per_rank],
                          "member_s": [round(t, 3) for _, t in sorted(i for b in busy[k] for i in b.items())],
                          "balance": round(float(np.mean(per_rank) / np.max(per_rank)), 3)}), flush=True)


def _ensemble(root: Path, members: int, samples: int, size: int, seed: int) -> tuple[Path, Path]:
    from galapagos.evolve.space import SearchSpace
    from galapagos.examples import shapes
    from galapagos.examples.random_ensemble import write_random_ensemble

    data, ens = root / "shapes.h5", root / "ens"
    # test = `samples`; a small train split gives the members their normalisation statistics
    shapes.generate(data, samples=int(samples / 0.8) + 3, size=size, seed=seed, fractions=(0.1, 0.1, 0.8))
    space = SearchSpace(min_layers=3, max_layers=6, channels=(16, 32), kernels=(3,), units=(32, 64),
                        layer_types=("conv", "residual", "pool", "norm", "dense"), max_params=300_000)
    write_random_ensemble(ens, data, members, seed=seed, space=space)
    return ens, data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--samples", type=int, default=2000, help="test samples predicted")
    p.add_argument("--size", type=int, default=32, help="image edge in pixels")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=int, default=2, help="timed passes per rank count (the best is kept)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inner", nargs=3, metavar=("ENS", "DATA", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inner:
        ens, data, out = args.inner
        _inner(ens, data, args.batch, out, args.repeats)
        return
    from galapagos.launch.mpi import mpiexec

    with tempfile.TemporaryDirectory(prefix="galapagos-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        ens, data = _ensemble(root, args.members, args.samples, args.size, args.seed)
        print(f"ensemble of {args.members} random conv nets on {args.samples} images 1x{args.size}x{args.size} "
              f"written in {time.perf_counter() - t0:.1f} s", flush=True)
        env = dict(os.environ, PYTHONPATH=os.getcwd())
        rows = []
        for r in args.ranks:
            out = root / f"r{r}.npz"
            cmd = [mpiexec(), "-n", str(r), sys.executable, "-m", "bench.ensemble_predict", "--batch", str(args.batch),
                   "--repeats", str(args.repeats), "--inner", str(ens), str(data), str(out)]
            proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                sys.exit(f"mpiexec -n {r} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            rows.append((json.loads(proc.stdout.strip().splitlines()[-1]), np.load(out)))
        base_rate = rows[0][0]["samples_per_s"]
        ref = rows[0][1]
        cost = rows[0][0]["member_s"]  # each member's forward time in the first run
        print(f"\nmember forward seconds ({rows[0][0]['ranks']} rank): {cost}")
        print(f"\n| ranks | samples/s | speedup vs {rows[0][0]['ranks']} rank | ideal min(ranks, members) "
              "| balance (mean/max busy) | max abs diff of mean vs first | of members |")
        print("|---|---|---|---|---|---|---|")
        for res, arrays in rows:
            diff = float(np.abs(arrays["mean"] - ref["mean"]).max())
            mdiff = float(np.abs(arrays["members"] - ref["members"]).max())
            print(f"| {res['ranks']} | {res['samples_per_s']:.0f} | {res['samples_per_s'] / base_rate:.2f} | "
                  f"{min(res['ranks'], args.members)} | {res['balance']:.2f} | {diff:.1e} | {mdiff:.1e} |")
        for res, _ in rows:
            print(f"{res['ranks']} rank(s): best of {res['times']} s; busy seconds per rank {res['busy_s']}")
            if diff > 1e-5:
                sys.exit(f"{res['ranks']} ranks: predictions differ from {rows[0][0]['ranks']} rank by {diff:g}")


if __name__ == "__main__":
    main()
