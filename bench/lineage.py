"""Why an evolution run's pick scores lower in test than in validation: each kept network of runs kept with
`python -m bench.search ... --keep DIR`, its validation and test scores against its lineage.

A child that inherits weights starts from its parent's best epoch, itself chosen on the validation split, so a
lineage's weights have been selected on that split once per generation. This reads, for every network whose
weights a run kept (models/: the best `run.keep_models` and the population), the length of its lineage (how many
ancestors' trainings its weights went through), the epochs along it, and its epoch chosen among its own, then
scores it on the test split (galapagos/flows/final_pick.py's scoring, as its fitness is computed).

    python -m bench.lineage DIR [DIR ...]     # run directories (DIR/NAME-evolution-SEED) or --keep directories
    python -m bench.lineage --picks DIR ...   # each run's pick only, from its journal: no data read, nothing scored

The epochs along a lineage are those its trainings ran; the epochs its weights carry are the best epoch of each,
since a child starts from its parent's best epoch (with `train.inherit_shrink` below 1, part of the way back to a
fresh initialisation).
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

__all__ = ["lineages", "picks", "main"]


def _line(r, by_id: dict) -> dict:
    """`r`'s lineage: generations (trainings its weights went through, its own included, a training's rungs
    one), epochs (run along it) and carried (the best epochs along it, the training its weights hold)."""
    generations, epochs, carried = 0, 0, 0
    while r is not None:
        generations += 1
        epochs += len(r.curve)
        carried += r.metrics.get("best_epoch") or 0  # a promotion's counts its earlier rungs' epochs
        while r.origin == "promoted" and r.parents and r.parents[0] in by_id:  # the same training's earlier rung
            r = by_id[r.parents[0]]
            epochs += len(r.curve)
        r = by_id.get(r.inherits)  # None: a fresh start
    return {"generations": generations, "epochs": epochs, "carried": carried}


def _journal(run: Path) -> tuple[dict, int]:
    """`run`'s journal by id, and the id of its pick (summary.json's best)."""
    by_id = {r.id: r for r in RunDir(run).read_journal()}
    return by_id, json.loads((run / "summary.json").read_text())["best"]["id"]


def picks(run: Path) -> dict:
    """The pick of `run` (a finished evolution run directory) from its journal alone: id, val, train loss (at its
    best epoch), best epoch, parameters and its lineage (`_line`)."""
    by_id, pick = _journal(run)
    r = by_id[pick]
    return {"id": r.id, "val": r.fitness, "train_loss": r.metrics.get("train_loss"), "params": r.params,
            "best_epoch": r.metrics.get("best_epoch"), **_line(r, by_id)}


def lineages(run: Path, data: Path) -> list[dict]:
    """One row per kept network of `run` (an evolution run directory) that evolved on `data`, best by validation
    first: id, val, train and test scores, parameters, its lineage (`_line`), its best epoch, whether it is the
    run's pick."""
    rd = RunDir(run)
    by_id, pick = _journal(run)
    config = load_config(run / "config.toml", [])
    info, arrays = load(str(data), ("train", "test"))
    problem = Problem.of_dataset(info)
    split = {name: tuple(torch.from_numpy(a) for a in arrays[name]) for name in ("train", "test")}
    rows = []
    with torch.no_grad():
        for r in sorted(by_id.values(), key=lambda r: -1.0 if r.fitness is None else r.fitness, reverse=True):
            if r.fitness is None or not Path(rd.model_path(r.id)).exists():
                continue
            on = {name: score(r, rd.model_path(r.id), problem, config, *split[name]) for name in split}
            rows.append({"id": r.id, "val": r.fitness, **on, "params": r.params, **_line(r, by_id),
                         "best_epoch": r.metrics.get("best_epoch"), "pick": r.id == pick})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.lineage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--picks", action="store_true", help="each run's pick from its journal alone")
    args = p.parse_args(argv)
    runs = [d for top in args.dirs for d in ([top] if (top / "results.jsonl").exists()
                                             else sorted(top.glob("*-evolution*-*")) if top.is_dir() else [])
            if (d / "summary.json").exists()]  # a finished run (an abandoned one has no summary)
    if args.picks:
        print("| run | id | val | train loss | parameters | generations | epochs | carried | best epoch |\n"
              + "|---" * 9 + "|")
        for run in runs:
            r = picks(run)
            print(f"| {run.name} | {r['id']} | {r['val']:.4f} | {r['train_loss']:.4f} | {r['params']:,} "
                  f"| {r['generations']} | {r['epochs']} | {r['carried']} | {r['best_epoch']} |")
        return
    gaps, depth = [], []
    for run in runs:
        dataset = run.name.split("-evolution")[0]
        rows = lineages(run, run.parent / f"{dataset}.h5")
        print(f"{run}: {len(rows)} kept networks")
        print("| id | val | test | val - test | train | parameters | generations | epochs | carried | best epoch "
              "| pick |\n" + "|---" * 11 + "|")
        for r in rows:
            print(f"| {r['id']} | {r['val']:.4f} | {r['test']:.4f} | {r['val'] - r['test']:+.4f} | {r['train']:.4f} "
                  f"| {r['params']:,} | {r['generations']} "
                  f"| {r['epochs']} | {r['carried']} | {r['best_epoch']} | {'yes' if r['pick'] else ''} |")
            gaps.append(r["val"] - r["test"])
            depth.append(r["generations"])
    if len(gaps) > 2:
        print(f"\n{len(gaps)} networks: val - test {np.mean(gaps):+.4f} in the mean; its correlation with the "
              f"lineage's length {np.corrcoef(gaps, depth)[0, 1]:+.2f}")


if __name__ == "__main__":
    main()
