"""Why an evolution run's pick scores lower in test than in validation: each kept network of runs kept with
`python -m bench.search ... --keep DIR`, its validation and test scores against its lineage.

A child that inherits weights starts from its parent's best epoch, itself chosen on the validation split, so a
lineage's weights have been selected on that split once per generation. This reads, for every network whose
weights a run kept (models/: the best `run.keep_models` and the population), the length of its lineage (how many
ancestors' trainings its weights went through), the epochs along it, and its epoch chosen among its own, then
scores it on the test split (galapagos/flows/final_pick.py's scoring, as its fitness is computed).

    python -m bench.lineage DIR [DIR ...]     # run directories (DIR/NAME-evolution-SEED) or --keep directories
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from galapagos.config import load_config
from galapagos.datashare.format import load
from galapagos.evolve.problem import Problem
from galapagos.flows.final_pick import score
from galapagos.store.rundir import RunDir

__all__ = ["lineages", "main"]


def lineages(run: Path, data: Path) -> list[dict]:
    """One row per kept network of `run` (an evolution run directory) that evolved on `data`, best by validation
    first: id, val, train and test scores, parameters, generations (trainings along its lineage, its own included),
    epochs (along it), its best epoch, whether it is the run's pick."""
    rd = RunDir(run)
    records = rd.read_journal()
    by_id = {r.id: r for r in records}
    config = load_config(run / "config.toml", [])
    info, arrays = load(str(data), ("train", "test"))
    problem = Problem.of_dataset(info)
    split = {name: tuple(torch.from_numpy(a) for a in arrays[name]) for name in ("train", "test")}
    pick = json.loads((run / "summary.json").read_text())["best"]["id"]
    rows = []
    with torch.no_grad():
        for r in sorted(records, key=lambda r: -1.0 if r.fitness is None else r.fitness, reverse=True):
            if r.fitness is None or not Path(rd.model_path(r.id)).exists():
                continue
            generations, epochs, a = 0, 0, r
            while a is not None:
                generations += 1
                epochs += len(a.curve)
                a = by_id.get(a.inherits)  # None: a fresh start
            on = {name: score(r, rd.model_path(r.id), problem, config, *split[name]) for name in split}
            rows.append({"id": r.id, "val": r.fitness, **on, "params": r.params,
                         "generations": generations, "epochs": epochs, "best_epoch": r.metrics.get("best_epoch"),
                         "pick": r.id == pick})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.lineage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path)
    args = p.parse_args(argv)
    runs = [d for top in args.dirs for d in ([top] if (top / "results.jsonl").exists()
                                             else sorted(top.glob("*-evolution*-*")) if top.is_dir() else [])
            if (d / "summary.json").exists()]  # a finished run (an abandoned one has no summary)
    gaps, depth = [], []
    for run in runs:
        dataset = run.name.split("-evolution")[0]
        rows = lineages(run, run.parent / f"{dataset}.h5")
        print(f"{run}: {len(rows)} kept networks")
        print("| id | val | test | val - test | train | parameters | generations | epochs | best epoch | pick |\n"
              + "|---" * 10 + "|")
        for r in rows:
            print(f"| {r['id']} | {r['val']:.4f} | {r['test']:.4f} | {r['val'] - r['test']:+.4f} | {r['train']:.4f} "
                  f"| {r['params']:,} | {r['generations']} "
                  f"| {r['epochs']} | {r['best_epoch']} | {'yes' if r['pick'] else ''} |")
            gaps.append(r["val"] - r["test"])
            depth.append(r["generations"])
    if len(gaps) > 2:
        print(f"\n{len(gaps)} networks: val - test {np.mean(gaps):+.4f} in the mean; its correlation with the "
              f"lineage's length {np.corrcoef(gaps, depth)[0, 1]:+.2f}")


if __name__ == "__main__":
    main()
