"""Rank start-up with and without staging (`launch --stage`): the time from mpiexec to every rank having imported
what a worker imports (torch, the trainer, mpi4py) and met at a barrier.

    python -m bench.startup --ranks 4 --stage-dir /dev/shm

Three starts of the same ranks, one run:
- cold: the environment read from its file system with the page cache dropped (what thousands of ranks meet on a
  shared file system: every import a metadata lookup and a read that no cache on the node has yet);
- staged: the environment packed into one tar (as `launch --stage` does; not timed: it is made once, at launch),
  the cache dropped, then the tar unpacked into node-local `--stage-dir` and the ranks started from there; both
  steps timed, as the job script does them;
- warm: the page cache hot, the floor that no staging can beat.
Dropping the page cache needs root (/proc/sys/vm/drop_caches); without it, only warm figures are given.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from galapagos.launch.mpi import mpiexec
from galapagos.launch.scripts.stage import environment, pack_environment

PROBE = ("import torch, numpy, h5py, launch.trainer, launch.session, evolve.train; from mpi4py import MPI; "
         "MPI.COMM_WORLD.Barrier()")


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def start(python: str, ranks: int) -> float:
    """Seconds from mpiexec to every rank past the barrier (the job's end, a few ms later)."""
    t0 = time.perf_counter()
    subprocess.run([mpiexec(), "-n", str(ranks), python, "-c", PROBE], check=True, cwd=Path(__file__).parents[1])
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--stage-dir", default="/dev/shm", help="node-local storage to stage into")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    prefix = environment()
    python = str(Path(sys.executable).parent / "python")
    out: dict = {"ranks": args.ranks, "environment": str(prefix)}
    with tempfile.TemporaryDirectory(prefix="galapagos-bench-") as tmp:
        tar = pack_environment(prefix, Path(tmp))
        out["tar_mib"] = round(tar.stat().st_size / 2**20)
        start(python, args.ranks)  # warms what the first start compiles (.pyc)
        cold, staged, unpack, warm = [], [], [], []
        for _ in range(args.repeat):
            if drop_caches():
                cold.append(start(python, args.ranks))
                drop_caches()
                stage = Path(tempfile.mkdtemp(prefix="galapagos-stage-", dir=args.stage_dir))
                try:
                    t0 = time.perf_counter()
                    with tarfile.open(tar) as t:
                        t.extractall(stage, filter="tar")
                    unpack.append(time.perf_counter() - t0)
                    staged.append(start(str(stage / prefix.name / "bin" / "python"), args.ranks))
                finally:
                    shutil.rmtree(stage, ignore_errors=True)
            warm.append(start(python, args.ranks))
    best = min
    out["warm_s"] = round(best(warm), 2)
    if cold:
        out.update(cold_s=round(best(cold), 2), unpack_s=round(best(unpack), 2), staged_start_s=round(best(staged), 2))
        out["staged_total_s"] = round(best(unpack) + best(staged), 2)
        out["cold_over_staged_start"] = round(best(cold) / best(staged), 2)
    else:
        out["note"] = "no root: the page cache could not be dropped, only warm starts were measured"
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
