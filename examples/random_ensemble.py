"""A synthetic ensemble directory of random networks, to try `galapagos predict` without evolving or training.

    python -m galapagos.examples.random_ensemble --data shapes.h5 --out ens --members 8 [--steps 20]

Each member is a random genome of the search space (repaired to fit the data), with the training split's
normalisation statistics and, with ``--steps``, a few optimizer steps on the training split, so members give
distinct, sensible predictions. Weights are equal unless given. Tests and benchmarks use it; a real ensemble
comes from `galapagos ensemble`.
"""
from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from galapagos.datashare.format import load
from galapagos.evolve.build import build_model, set_normalization
from galapagos.evolve.check import check_genome
from galapagos.evolve.errors import InvalidGenome
from galapagos.evolve.netdir import NetworkDir, save_weights
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.train import normalization_stats
from galapagos.store.ensembledir import EnsembleDir, Manifest, Member, save_manifest


def _train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (min(64, len(x)),), generator=gen)
        out = model(x[idx])
        if task == "classification":
            loss = torch.nn.functional.cross_entropy(out, y[idx])
        else:
            loss = (((out - y[idx]) / model.y_std) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def write_random_ensemble(out: str | Path, data: str | Path, members: int = 4, *, seed: int = 0, steps: int = 0,
                          space: SearchSpace | None = None, weights: Sequence[float] | None = None) -> Manifest:
    """Write `members` random networks for the dataset `data` as an ensemble directory `out`; returns its manifest."""
    info, splits = load(data, ("train",))
    problem = Problem(tuple(info.sample_shape), info.task, info.num_targets)
    space = space or SearchSpace(max_layers=4, channels=(8, 16), units=(16, 32), max_params=200_000)
    x, y = (torch.from_numpy(a) for a in splits["train"])
    stats = normalization_stats(x, y, problem.task)
    rng = random.Random(seed)
    weights = list(weights) if weights is not None else [1.0 / members] * members
    out = Path(out)
    listed = []
    for i in range(members):
        while True:
            try:
                genome = check_genome(space.random_genome(rng, problem), problem, space)
                break
            except InvalidGenome:
                continue
        torch.manual_seed(seed * 1000 + i)
        model = build_model(genome, problem)
        set_normalization(model, **stats)
        if steps:
            _train(model, x, y, problem.task, steps, seed * 1000 + i)
        name = f"m{i:03d}"
        net = NetworkDir(EnsembleDir(out).member(name))
        net.write(genome.to_json(), {"problem": problem.to_dict(), "describe": genome.describe(),
                                     "params": sum(p.numel() for p in model.parameters())})
        save_weights(model.state_dict(), net.model_file)
        listed.append(Member(name, weights[i], seed=seed * 1000 + i, origin={"kind": "random", "steps": steps}))
    manifest = Manifest(problem, tuple(listed), {"method": "equal"}, {"data": str(data)})
    save_manifest(out, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m galapagos.examples.random_ensemble",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="HDF5 dataset the members are for")
    parser.add_argument("--out", required=True, help="ensemble directory to write")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps per member on the training split")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    manifest = write_random_ensemble(args.out, args.data, args.members, seed=args.seed, steps=args.steps)
    print(f"wrote {args.out}: {len(manifest.members)} members for {manifest.problem.task} "
          f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
