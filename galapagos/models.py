"""Saved networks and ensembles as torch modules: which network a `--model` path names, and an ensemble directory's
members as one module that averages them, as `predict` does (what `load`, `predict`, `export` and the ensemble
build share)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from galapagos.datashare.format import CLASS_TASKS
from galapagos.ensemble.average import member_output
from galapagos.errors import UsageError
from galapagos.evolve.genome import Genome
from galapagos.evolve.netdir import ModelError, NetworkDir
from galapagos.evolve.problem import Problem
from galapagos.store.ensembledir import EnsembleDir, is_ensemble, load_manifest
from galapagos.store.rundir import RunDir


def model_dir(path: str | Path) -> NetworkDir:
    """The network `--model` names: a network directory, or a run directory meaning its best network."""
    net, best = NetworkDir(path), NetworkDir(RunDir(path).best)
    if best.genome_file.exists() and not net.genome_file.exists():
        net = best
    if (missing := net.missing()) is not None:
        raise ModelError(f"--model {path}: {missing} is missing (expected a run's best/ directory or an "
                         "ensemble directory)")
    return net


def load_network(path: str | Path, device: str = "cpu") -> tuple[torch.nn.Module, Genome, Problem]:
    net = model_dir(path)
    try:
        return net.load(device)
    except ModelError as exc:
        raise ModelError(f"--model {exc}") from None


def predict_outputs(model: torch.nn.Module, x: np.ndarray, problem: Problem, *, batch: int = 1024,
                    device: str = "cpu") -> np.ndarray:
    """Class probabilities (N, K) or regression outputs (N, T), in batches."""
    outs = [member_output(model, x[i:i + batch], problem.task, device) for i in range(0, len(x), batch)]
    return np.concatenate(outs) if outs else np.zeros((0, problem.num_outputs), np.float32)



class Ensemble(torch.nn.Module):
    """An ensemble directory's members as one module: their weighted mean class probabilities, or regression
    outputs, as `predict` averages them."""

    def __init__(self, members: list[torch.nn.Module], weights: list[float], task: str):
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        self.register_buffer("weights", torch.tensor(weights, dtype=torch.float32))
        self.task = task

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [m(x).float() for m in self.members]
        if self.task in CLASS_TASKS:
            outs = [o.softmax(1) for o in outs]
        return sum(w * o for w, o in zip(self.weights, outs))


def load_ensemble(root: str | Path, device: str = "cpu") -> Ensemble:
    manifest = load_manifest(root)
    members = [load_network(EnsembleDir(root).member(m.name), device)[0] for m in manifest.used]
    return Ensemble(members, [m.weight for m in manifest.used], manifest.problem.task).to(device).eval()


def load_model(path: str | Path, device: str = "cpu", *, logits: bool = False) -> torch.nn.Module:
    """What `galapagos.load` gives: an ensemble directory as an Ensemble, a network as a module in eval mode that
    gives class probabilities as `predict` and `export` do (`logits`: its raw outputs), or regression outputs."""
    if is_ensemble(path):
        if logits:
            raise UsageError(f"{path}: an ensemble averages its members' probabilities and has no logits; load a "
                             "member directory (members/NAME) for one network's logits")
        return load_ensemble(path, device)
    net, _, problem = load_network(path, device)
    if problem.task in CLASS_TASKS and not logits:
        net = torch.nn.Sequential(net, torch.nn.Softmax(1))
    return net.to(device).eval()
