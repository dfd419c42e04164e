"""Scoring a saved network on any split of any file in the format."""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import torch

from datashare.format import DataError, load
from ensemble.metrics import classification_metrics, regression_metrics
from evolve.build import build_model
from evolve.genome import Genome
from evolve.problem import Problem


class ModelError(ValueError):
    pass


def model_dir(path: str | Path) -> Path:
    """A run directory means its best network."""
    p = Path(path)
    if (p / "best" / "genome.json").exists() and not (p / "genome.json").exists():
        p = p / "best"
    for name in ("genome.json", "model.pt", "metrics.json"):
        if not (p / name).exists():
            raise ModelError(f"--model {path}: {p / name} is missing (expected a run's best/ directory)")
    return p


def load_network(path: str | Path, device: str = "cpu") -> tuple[torch.nn.Module, Genome, Problem]:
    p = model_dir(path)
    try:
        genome = Genome.from_json(json.loads((p / "genome.json").read_text()))
        problem = Problem.from_dict(json.loads((p / "metrics.json").read_text())["problem"])
    except (ValueError, KeyError) as exc:
        raise ModelError(f"--model {p}: unreadable genome.json or metrics.json: {exc}") from None
    model = build_model(genome, problem)
    try:
        model.load_state_dict(torch.load(p / "model.pt", map_location="cpu", weights_only=True))
    except (RuntimeError, OSError, EOFError) as exc:
        raise ModelError(f"--model {p}: model.pt does not fit the genome: {str(exc).splitlines()[0]}") from None
    return model.to(device).eval(), genome, problem


def predict_outputs(model: torch.nn.Module, x: np.ndarray, problem: Problem, *, batch: int = 1024,
                    device: str = "cpu") -> np.ndarray:
    """Class probabilities (N, K) or regression outputs (N, T), in batches."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch])).to(device)).float()
            outs.append((out.softmax(1) if problem.task == "classification" else out).cpu().numpy())
    return np.concatenate(outs) if outs else np.zeros((0, problem.num_outputs), np.float32)


def predict(model_path: str | Path, data: str | Path, split: str = "test", *, save: str | Path | None = None,
            device: str = "cpu") -> dict:
    """Score the network on `split`; optionally write predictions (and the truth) to an HDF5 file."""
    model, genome, problem = load_network(model_path, device)
    info, splits = load(data, (split,))
    if split not in splits:
        raise DataError(f"{data}: /{split}: no such split (the file has {', '.join(info.splits)})")
    if tuple(info.sample_shape) != problem.sample_shape or info.task != problem.task \
            or info.num_targets != problem.num_outputs:
        raise DataError(f"{data}: /{split}/x: the model expects {problem.task} with samples of shape "
                        f"{problem.sample_shape} and {problem.num_outputs} outputs; the file has {info.task}, "
                        f"{tuple(info.sample_shape)}, {info.num_targets}")
    x, y = splits[split]
    out = predict_outputs(model, x, problem, device=device)
    if problem.task == "classification":
        metrics = classification_metrics(out, y)
    else:
        metrics = regression_metrics(out, y, list(info.target_names) if info.target_names else None)
    if save:
        with h5py.File(save, "w") as f:
            f.create_dataset("probabilities" if problem.task == "classification" else "predictions", data=out)
            f.create_dataset("y", data=y)
            f.attrs["model"] = str(model_dir(model_path))
            f.attrs["data"], f.attrs["split"] = str(data), split
    return {"split": split, "task": problem.task, **metrics}
