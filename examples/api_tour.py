"""The Python API from start to finish on the bundled shapes data: evolve, build an ensemble, predict, and use the
ensemble as a plain torch module.

    python -m galapagos.examples.api_tour --out runs/tour [--evaluations 12] [--members 3] [--workers 2]

Every call starts its own MPI job (mpiexec) and returns rank 0's result; the same script run under
`srun -n 9 python -m galapagos.examples.api_tour ...` runs each job on the ranks it was given instead.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import torch

import galapagos
from galapagos.examples import shapes

# Small networks and short trainings, so that the tour takes a minute or two on a laptop.
QUICK = {"train.epochs": 3, "space.max_layers": 4, "space.channels": [4, 8, 16], "space.units": [16, 32],
         "evolution.population_size": 6, "ensemble.epochs": 3}


def tour(out: Path, *, evaluations: int = 12, members: int = 3, workers: int = 2) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    data = out / "shapes.h5"
    if not data.exists():
        shapes.generate(data, samples=1200)
    run = galapagos.evolve(data, out / "run", evaluations=evaluations, workers=workers, set=QUICK)
    if run is None:  # a worker rank of a job started by srun/mpiexec: rank 0 reports
        return {}
    print(f"search: {len(run.trials)} evaluations, best val accuracy {run.best.fitness:.3f} ({run.best.params})")
    ens = galapagos.ensemble(run, data, out / "ensemble", members=members, workers=workers)
    selection = ens.metrics["selection"]
    print(f"ensemble: val NLL {selection['single_best']:.4f} (best member) -> {selection['ensemble']:.4f}")
    best = galapagos.predict(run, data, "test")
    scores = galapagos.predict(ens, data, "test", workers=1)
    print(f"test accuracy: best network {best['accuracy']:.3f}, ensemble {scores['accuracy']:.3f}")
    model = galapagos.load(ens)  # a torch module: the members' averaged class probabilities
    with h5py.File(data, "r") as f:
        x, y = torch.from_numpy(f["test/x"][:]), torch.from_numpy(f["test/y"][:])
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    print(f"the loaded ensemble in plain torch: test accuracy {accuracy:.3f}")
    return {"run": run, "ensemble": ens, "best": best, "predict": scores, "torch_accuracy": accuracy,
            "report": galapagos.report(run)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m galapagos.examples.api_tour", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--evaluations", type=int, default=12)
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    tour(args.out, evaluations=args.evaluations, members=args.members, workers=args.workers)


if __name__ == "__main__":
    main()
