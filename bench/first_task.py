"""From the command to the first task: how long `galapagos evolve` takes until a worker's trainer starts training.

    python -m bench.first_task --gib 0 1 --workers 2

Each case runs the real command (`galapagos evolve`: its checks, mpiexec, every rank's start, the data shared, the
trainer children started) on a dataset of `--gib` GiB (0: the bundled shapes example, 2.5 MiB) until two
evaluations have finished, and reads from the run directory when the first task started (a journal record's
`start`: when a worker handed the task to its trainer child), when its training began (the record's `end` less
its `train_seconds`: after the trainer child started its GPU runtime, moved the data to the device and built the
network; a bound that also holds the latency probe and the saving of weights, milliseconds) and how long the data
took to share (master.log).

The floor it is held to, measured in the same run: one Python process importing what a trainer imports (torch and
evolve.train), plus the data's sharing: what no start can avoid. `over_floor` is command-to-first-task over that sum;
whatever the ranks and the command do besides (their own imports, the checks, a trainer child started only after
the data is shared) shows in it.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.datashare import make_file

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ["train.epochs=1", "space.max_params=20000", "train.max_train_samples=256"]


def import_floor(repeats: int = 2) -> float:
    """Seconds for one Python process to import what a trainer child imports (best of `repeats`)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, evolve.train"], check=True, cwd=REPO)
        times.append(time.perf_counter() - t0)
    return min(times)


def first_task(data: Path, out: Path, workers: int) -> dict:
    t0 = time.time()
    cmd = [sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(data), "--out", str(out), "--workers",
           str(workers), "--evaluations", "2"] + [a for s in SETTINGS for a in ("--set", s)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    first = min(records, key=lambda r: r["start"])
    shared = re.search(r"shared .* in ([0-9.]+) s", (out / "log" / "master.log").read_text())
    return {"first_task_s": round(first["start"] - t0, 2),
            "training_began_s": round(first["end"] - first["metrics"]["train_seconds"] - t0, 2),
            "share_s": float(shared.group(1)) if shared else 0.0}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m bench.first_task", description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[0.0, 1.0], help="dataset sizes (0: shapes)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs per size; the fastest is reported")
    args = ap.parse_args(argv)
    floor = import_floor()
    rows = []
    with tempfile.TemporaryDirectory(prefix="galapagos-bench-") as tmp:
        for gib in args.gib:
            data = Path(tmp) / f"data-{gib:g}.h5"
            if gib:
                make_file(data, gib)
            else:
                subprocess.run([sys.executable, "-m", "galapagos.examples.shapes", "--out", str(data)], check=True,
                               cwd=REPO,
                               capture_output=True)
            runs = [first_task(data, Path(tmp) / f"run-{gib:g}-{i}", args.workers) for i in range(args.repeats)]
            best = min(runs, key=lambda r: r["first_task_s"])
            row = {"gib": gib, "workers": args.workers, **best, "import_floor_s": round(floor, 2),
                   "over_floor": round(best["first_task_s"] / (floor + best["share_s"]), 2)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
