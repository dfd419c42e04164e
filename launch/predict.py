"""Scoring a saved network, or an ensemble of them, on any split of any file in the format."""
from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from datashare.format import DataError, DatasetInfo, load
from ensemble.average import Averaged, assigned, average, first_error, member_output
from ensemble.metrics import classification_metrics, regression_metrics
from ensemble.store import EnsembleError, Manifest, is_ensemble, load_manifest, member_dir
from evolve.build import build_model
from evolve.genome import Genome
from evolve.problem import Problem

log = logging.getLogger(__name__)


class ModelError(ValueError):
    pass


def model_dir(path: str | Path) -> Path:
    """A run directory means its best network."""
    p = Path(path)
    if (p / "best" / "genome.json").exists() and not (p / "genome.json").exists():
        p = p / "best"
    for name in ("genome.json", "model.pt", "metrics.json"):
        if not (p / name).exists():
            raise ModelError(f"--model {path}: {p / name} is missing (expected a run's best/ directory or an "
                             "ensemble directory)")
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
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as exc:
        raise ModelError(f"--model {p}: model.pt is unreadable or does not fit the genome: "
                         f"{str(exc).splitlines()[0]}") from None
    return model.to(device).eval(), genome, problem


def predict_outputs(model: torch.nn.Module, x: np.ndarray, problem: Problem, *, batch: int = 1024,
                    device: str = "cpu") -> np.ndarray:
    """Class probabilities (N, K) or regression outputs (N, T), in batches."""
    outs = [member_output(model, x[i:i + batch], problem.task, device) for i in range(0, len(x), batch)]
    return np.concatenate(outs) if outs else np.zeros((0, problem.num_outputs), np.float32)


def read_split(data: str | Path, split: str, problem: Problem) -> tuple[DatasetInfo, np.ndarray, np.ndarray]:
    """The split's x and y, refused unless they fit what the model was trained for."""
    info, splits = load(data, (split,))
    if split not in splits:
        raise DataError(f"{data}: /{split}: no such split (the file has {', '.join(info.splits)})")
    if tuple(info.sample_shape) != problem.sample_shape or info.task != problem.task \
            or info.num_targets != problem.num_outputs:
        raise DataError(f"{data}: /{split}/x: the model expects {problem.task} with samples of shape "
                        f"{problem.sample_shape} and {problem.num_outputs} outputs; the file has {info.task}, "
                        f"{tuple(info.sample_shape)}, {info.num_targets}")
    x, y = splits[split]
    return info, x, y


def score(task: str, out: np.ndarray, y: np.ndarray, info: DatasetInfo) -> dict:
    """Accuracy, NLL and ECE of class probabilities; MSE, MAE and R^2 per target of regression outputs."""
    if task == "classification":
        return classification_metrics(out, y)
    return regression_metrics(out, y, list(info.target_names) if info.target_names else None)


def predict(model_path: str | Path, data: str | Path, split: str = "test", *, save: str | Path | None = None,
            device: str = "cpu", batch: int = 1024) -> dict:
    """Score the network on `split`; optionally write predictions (and the truth) to an HDF5 file."""
    model, _, problem = load_network(model_path, device)
    info, x, y = read_split(data, split, problem)
    out = predict_outputs(model, x, problem, device=device, batch=batch)
    metrics = score(problem.task, out, y, info)
    if save:
        with h5py.File(save, "w") as f:
            f.create_dataset("probabilities" if problem.task == "classification" else "predictions", data=out)
            f.create_dataset("y", data=y)
            f.attrs["model"] = str(model_dir(model_path))
            f.attrs["data"], f.attrs["split"] = str(data), split
    return {"split": split, "task": problem.task, **metrics}


# -- ensembles ---------------------------------------------------------------------------------------------------
def _device(comm: Any, members: int) -> str:
    """Collective: this rank's device: its GPU by node-local rank, else (several ranks) its share of the node's cores.

    Ranks that the launcher already bound to disjoint cores (srun --cpu-bind, mpiexec -bind-to) keep their cores;
    ranks that share the node's cores split them evenly, as workers do. Idle ranks (no member) get no share.
    """
    from launch.placement import place

    if comm is None or comm.Get_size() == 1:
        device = place(0, 1).device
    else:
        from launch.mpi import node_comm

        own = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        node = node_comm(comm)
        active = [(r, c) for r, c in sorted(node.allgather((comm.Get_rank(), own))) if r < members]
        node.Free()
        ranks = [r for r, _ in active]
        if comm.Get_rank() not in ranks:
            return "cpu"
        sets = [set(c) for _, c in active]
        bound = all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1:])
        p = place(ranks.index(comm.Get_rank()), len(active), allowed=sorted(set().union(*sets)) or None)
        device = p.device
        if device == "cpu" and own:
            cores = own if bound else list(p.cores)
            if not bound:
                try:
                    os.sched_setaffinity(0, cores)
                except OSError as exc:
                    log.warning("could not bind to cores %s: %s", cores, exc)
            torch.set_num_threads(len(cores))
    if device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    return device


def load_members(root: str | Path, comm: Any, split: str, data: str | Path
                 ) -> tuple[Manifest, list[tuple[int, torch.nn.Module]], str, tuple | None]:
    """Collective: the manifest, this rank's members on its device and (rank 0) the split; any rank's error on all."""
    rank = 0 if comm is None else comm.Get_rank()
    size = 1 if comm is None else comm.Get_size()
    manifest, error = None, None
    try:
        manifest = load_manifest(root)
    except EnsembleError as exc:
        error = exc
    if (error := first_error(comm, error)) is not None:  # before the collective placement below
        raise error
    used = manifest.used
    models, read = [], None
    try:
        device = _device(comm, len(used))
        for i in assigned(len(used), rank, size):
            path = member_dir(root, used[i].name)
            model, _, problem = load_network(path, device)
            if problem != manifest.problem:
                raise EnsembleError(f"{root}: member {used[i].name} was trained for {problem}, the ensemble is for "
                                    f"{manifest.problem}")
            models.append((i, model))
        if rank == 0:
            read = read_split(data, split, manifest.problem)
    except Exception as exc:  # noqa: BLE001 - shared with every rank below, raised on all
        error = exc
    if (error := first_error(comm, error)) is not None:
        raise error
    return manifest, models, device, read


def predict_ensemble(root: str | Path, data: str | Path, split: str = "test", *, comm: Any = None,
                     save: str | Path | None = None, batch: int = 1024, per_member: bool = True) -> dict | None:
    """Collective: the ensemble's weighted average on `split`, members spread over the ranks of `comm` (or one
    process without it); rank 0 gets the scores (ensemble and members) and writes `save`, other ranks get None."""
    if batch < 1:
        raise EnsembleError(f"--batch {batch}: must be positive")
    manifest, models, device, read = load_members(root, comm, split, data)
    used = manifest.used
    problem = manifest.problem
    x = read[1] if read else None
    avg = average(comm, models, [m.weight for m in used], x, problem.task, problem.num_outputs, batch=batch,
                  device=device, per_member=per_member)
    del models
    if avg is None:
        return None
    info, _, y = read
    result: dict[str, Any] = {"split": split, "task": problem.task, **score(problem.task, avg.mean, y, info),
                              "ranks": avg.ranks, "uncertainty": _uncertainty(avg, info)}
    if avg.members is not None:
        result["members"] = {m.name: {"weight": m.weight, **score(problem.task, avg.members[i], y, info)}
                             for i, m in enumerate(used)}
    if save:
        _save(save, avg, y, info, root=root, data=data, split=split, names=[m.name for m in used],
              weights=[m.weight for m in used])
    return result


def _uncertainty(avg: Averaged, info: DatasetInfo) -> dict:
    """Means over the samples: entropy and mutual information (classes), between-member std (regression)."""
    if avg.task == "classification":
        return {"entropy": float(avg.entropy.mean()) if len(avg.entropy) else float("nan"),
                "mutual_information": float(avg.mutual_information.mean()) if len(avg.entropy) else float("nan")}
    per = avg.std.mean(0) if len(avg.std) else np.full(avg.std.shape[1], np.nan)
    names = list(info.target_names) if info.target_names else [f"target_{i}" for i in range(len(per))]
    return {"std": float(per.mean()), "per_target": {n: {"std": float(v)} for n, v in zip(names, per)}}


def _save(path: str | Path, avg: Averaged, y: np.ndarray, info: DatasetInfo, *, root, data, split, names,
          weights) -> None:
    """Predictions and uncertainties per sample, each member's outputs, the truth, and where they came from."""
    classes = avg.task == "classification"
    with h5py.File(path, "w") as f:
        f.create_dataset("probabilities" if classes else "predictions", data=avg.mean)
        if classes:
            f.create_dataset("entropy", data=avg.entropy)
            f.create_dataset("mutual_information", data=avg.mutual_information)
        else:
            f.create_dataset("std", data=avg.std)
        if avg.members is not None:
            f.create_dataset("member_probabilities" if classes else "member_predictions", data=avg.members)
        f.create_dataset("y", data=y)
        f.attrs["model"], f.attrs["data"], f.attrs["split"] = str(root), str(data), split
        f.attrs["task"], f.attrs["ranks"] = avg.task, avg.ranks
        f.attrs["members"] = np.array(names, dtype=h5py.string_dtype())
        f.attrs["weights"] = np.asarray(weights, dtype=np.float64)
        if info.target_names:
            f.attrs["target_names"] = np.array(info.target_names, dtype=h5py.string_dtype())


def used_members(path: str | Path) -> int | None:
    """How many members predicting with `path` averages; None when it is a single network, not an ensemble."""
    return len(load_manifest(path).used) if is_ensemble(path) else None
