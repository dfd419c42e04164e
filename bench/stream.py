"""Training samples/s of one network on the same data held four ways, in one run; the ratios to resident are the
figures to track.

    python -m bench.stream --samples 16000 --size 16 --epochs 2 --rounds 3 --threads 1

- resident: both splits in memory whole (the shared copy; on a GPU moved whole to the device);
- shard: the rows one node of two holds in the shard mode (val whole), trained from that node's shared copy;
- stream: the training split read from the HDF5 file in chunks on a thread, ``--chunk-mib`` each, ``--depth``
  ahead, shuffled by chunk then within it (the file is in the page cache after the first epoch: this measures the
  path's own cost, not a parallel file system);
- batches: the resident copy on the host with each batch gathered and copied to the device (the GPU fallback for
  a split bigger than device memory; pinned buffers on a GPU, the same path unpinned on the CPU).
Every mode trains the same genome with the same seed and the same validation split; samples/s counts the training
rows of an epoch times the epochs over the candidate's train_seconds (which includes the validation passes, kept
small: 2% of the samples), after one untimed warm-up training. Modes alternate over ``--rounds`` and each keeps
its fastest; the CPU time per sample (all threads, the stream's reader too) is what a busy machine disturbs least.
Torch uses ``--threads`` threads (1 by default: no OpenMP spin-waiting in the CPU times).
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
import types
from pathlib import Path

import h5py
import numpy as np
import torch

from galapagos.datashare.plan import dataset_plan
from galapagos.datashare.stream import partial_plan
from galapagos.datashare.write import write_dataset
from galapagos.evolve.batches import DataAccess
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.train import TrainConfig, TrainTask, train_task

VAL = 0.02  # a small val split (carved alike in every mode), so its passes weigh little in train_seconds


def make_file(path: Path, samples: int, size: int) -> None:
    """Images with a learnable label, no val split (the modes carve the same one)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 1, size, size)).astype(np.float32)
    y = (x[:, 0, : size // 2].mean(axis=(1, 2)) > 0).astype(np.int64)
    write_dataset(path, {"train": (x, y)}, task="classification", num_classes=2)


def shared_copy(plan, memory, rows: dict | None = None) -> dict:
    """What a node's shared copy of a plan holds: its file arrays (``rows``: a node's range of some) and rank 0's."""
    out = {k: v[slice(*rows[k])] if rows and k in rows else v for k, v in memory.items()}
    with h5py.File(plan.path) as f:
        for s in plan.sources:
            if s.dataset is not None:
                a, b = rows[s.name] if rows and s.name in rows else (0, s.shape[0])
                out[s.name] = f[s.dataset][a:b].astype(s.dtype)
    return out


def train(arrays: dict, info, genome: Genome, epochs: int, device: str, access: DataAccess | None, rows: int
          ) -> dict:
    ctx = types.SimpleNamespace(data=arrays, device=device, cache={}, report=None)
    task = TrainTask(genome, Problem.of_dataset(info), TrainConfig(epochs=epochs, mixed_precision=False), seed=1,
                     data=access)
    cpu = time.process_time()
    out = train_task(task, ctx)
    cpu = time.process_time() - cpu  # every thread of this process: the stream's reader too
    seconds = out["metrics"]["train_seconds"]
    return {"samples_per_s": round(rows * epochs / seconds, 1), "train_seconds": round(seconds, 2),
            "cpu_ms_per_sample": round(1000 * cpu / (rows * epochs), 3), "train_rows": rows,
            "fitness": round(out["fitness"], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=16000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--chunk-mib", type=int, default=1)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.h5"
        make_file(path, args.samples, args.size)
        plan, memory, info = dataset_plan(str(path), val_fraction=VAL)
        resident = shared_copy(plan, memory)
        problem = Problem.of_dataset(info)
        space = SearchSpace(max_layers=4, channels=(8, 16), units=(32,), batch_sizes=(64,))
        rng = random.Random(3)
        genome = next(g for g in (space.random_genome(rng, problem) for _ in range(1000)) if "conv" in g.describe())
        row = args.size * args.size * 4
        chunk_rows = max(1, (args.chunk_mib << 20) // row)
        splan, smemory, sinfo, _ = partial_plan(str(path), "shard", val_fraction=VAL)
        n = sinfo.splits["train"]
        half = {k: (0, args.samples // 2) for k in ("train/x", "train/y", "train/keep")}
        shard = shared_copy(splan, smemory, half)
        tplan, tmemory, tinfo, spec = partial_plan(str(path), "stream", chunk_rows=chunk_rows, depth=args.depth,
                                                val_fraction=VAL)
        streamed = shared_copy(tplan, tmemory)
        train(resident, info, genome, 1, args.device, None, n)  # warm-up: the first training pays torch's start
        modes = {"resident": (resident, info, None, n),
                 "shard": (shard, sinfo, None, int(np.count_nonzero(shard["train/keep"]))),
                 "stream": (streamed, tinfo, DataAccess(spec), n),
                 "batches": (resident, info, DataAccess(device="batches"), n)}
        results: dict[str, dict] = {}
        for _ in range(args.rounds):  # rounds alternate the modes; each keeps its fastest (a shared machine is noisy)
            for mode, (arrays, minfo, access, rows) in modes.items():
                r = train(arrays, minfo, genome, args.epochs, args.device, access, rows)
                if mode not in results or r["samples_per_s"] > results[mode]["samples_per_s"]:
                    results[mode] = r
    base = results["resident"]["samples_per_s"]
    for r in results.values():
        r["ratio_to_resident"] = round(r["samples_per_s"] / base, 3)
    print(json.dumps({"machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, {args.device}",
                      "genome": genome.describe(), "data_mib": round(args.samples * (row + 8) / 2**20, 1),
                      "chunk_rows": chunk_rows,
                      "when": time.strftime("%Y-%m-%d %H:%M"), "modes": results}, indent=1))


if __name__ == "__main__":
    main()
