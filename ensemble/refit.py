"""The refit of an ensemble's members (`[ensemble] refit_epochs`): after selection, each member the ensemble uses
trains on for a few epochs on the training and validation rows together, from its own weights, at a share of its
genome's learning rate (`refit_lr`), and the ensemble keeps the weights selection gave it.

The search and the selection need the validation rows to score on; once both are done those rows are only data
the networks never learnt from (a third more than the training rows in a file split 60/20/20). The idea is
AutoGluon's `refit_full` (https://auto.gluon.ai/stable/api/autogluon.tabular.TabularPredictor.refit_full.html),
which retrains its models on all the data after validation has chosen them; here the members go on from their
trained weights (evolved networks inherited much of their training from their ancestors, which a retraining from
scratch would lose) on one short learning-rate cycle, and the last epoch is kept: no rows are left to choose one
on. The weights before the refit stay beside the member's as `fit.pt`, so that an interrupted or resumed build
selects on them again (`restore`).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import numpy as np

from galapagos.evolve.netdir import NetworkDir, save_weights
from galapagos.evolve.problem import Problem
from galapagos.evolve.task import TrainConfig

__all__ = ["FIT", "refit", "restore"]

FIT = "fit.pt"  # a refit member's weights from before its refit, which selection weighted


def restore(member: str | Path) -> None:
    """A refit member's weights as they were before its refit (nothing where it has none)."""
    net = NetworkDir(member)
    if (net.path / FIT).exists():
        os.replace(net.path / FIT, net.model_file)


def refit(member: str | Path, problem: Problem, train: tuple[np.ndarray, np.ndarray],
          val: tuple[np.ndarray, np.ndarray], recipe: TrainConfig, *, epochs: int, lr: float, seed: int,
          device: str = "cpu") -> dict:
    """Train the network in `member` on for `epochs` epochs on the `train` and `val` rows together, from its
    weights, by `recipe` but for one learning-rate cycle peaking at `lr` times its genome's; its model.pt becomes the
    last epoch's weights and the ones before go to fit.pt. What it did: epochs, rows, seconds, and the last epoch's
    training loss."""
    import torch  # here: rank 0 imports the ensemble flow, never torch

    from galapagos.evolve.train import train_candidate

    net = NetworkDir(member)
    _, genome, _ = net.load()
    state = torch.load(net.model_file, map_location="cpu", weights_only=True)
    x = torch.from_numpy(np.concatenate([train[0], val[0]]))
    y = torch.from_numpy(np.concatenate([train[1], val[1]]))
    recipe = dataclasses.replace(recipe, epochs=epochs, inherited_epochs=0, inherit_shrink=1.0, adaptive_shrink=False,
                                 holdout=0.0, max_train_samples=0)
    stats = {k: state[k] for k in ("x_mean", "x_std", "y_mean", "y_std") if k in state}  # its own normalisation
    start = time.perf_counter()
    summary, weights = train_candidate(dataclasses.replace(genome, lr=genome.lr * lr), problem,
                                       {"train": (x, y), "val": (torch.from_numpy(val[0]), torch.from_numpy(val[1]))},
                                       recipe, device=device, seed=seed, stats=stats, parent=state, keep_last=True)
    if not (net.path / FIT).exists():  # a second name for the weights selection chose (no room taken)
        try:
            os.link(net.model_file, net.path / FIT)
        except OSError:  # a file system without hard links
            shutil.copyfile(net.model_file, net.path / FIT)
    save_weights(weights, net.model_file)  # a new file in its place: fit.pt and the run's models/ keep theirs
    return {"epochs": epochs, "rows": len(y), "seconds": round(time.perf_counter() - start, 2),
            "train_loss": summary.get("train_loss")}
