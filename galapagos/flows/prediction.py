"""Scoring a saved network, or an ensemble of them, on any split of any file in the format."""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import h5py
import numpy as np
import torch

from galapagos.datashare.format import CLASS_TASKS, DataError, DatasetInfo, load
from galapagos.ensemble.average import Averaged, assigned, average, first_error
from galapagos.ensemble.metrics import classification_metrics, field_metrics, regression_metrics, segmentation_metrics
from galapagos.errors import RunDirError, UsageError
from galapagos.evolve.pareto import best_pick
from galapagos.evolve.problem import Problem
from galapagos.flows.mpijob import Flow
from galapagos.models import load_network, model_dir, predict_outputs
from galapagos.options import PredictOptions
from galapagos.store.ensembledir import EnsembleDir, EnsembleError, Manifest, is_ensemble, load_manifest
from galapagos.store.rundir import RunDir

log = logging.getLogger(__name__)


def read_split(data: str | Path, split: str, problem: Problem) -> tuple[DatasetInfo, np.ndarray, np.ndarray]:
    """The split's x and y, refused unless they fit what the model was trained for."""
    info, splits = load(data, (split,))
    if split not in splits:
        raise DataError(f"{data}: /{split}: no such split (the file has {', '.join(info.splits)})")
    if why := problem.mismatch(info):
        raise DataError(f"{data}: /{split}/x: the model expects {why}")
    x, y = splits[split]
    return info, x, y


def score(task: str, out: np.ndarray, y: np.ndarray, info: DatasetInfo) -> dict:
    """Accuracy, NLL and ECE of class probabilities; MSE, MAE and R^2 per target of regression outputs; mean and
    per-class IoU, pixel accuracy and NLL per pixel of segmentation; MSE, MAE and R^2 per target of fields."""
    names = list(info.target_names) if info.target_names else None
    if task == "classification":
        return classification_metrics(out, y)
    if task == "segmentation":
        return segmentation_metrics(out, y, info.ignore_index, names)
    if task == "field":
        return field_metrics(out, y, names)
    return regression_metrics(out, y, names)


def predict(model_path: str | Path, data: str | Path, split: str = "test", *, save: str | Path | None = None,
            device: str = "cpu", batch: int = 1024) -> dict:
    """Score the network on `split`; optionally write predictions (and the truth) to an HDF5 file."""
    model, _, problem = load_network(model_path, device)
    info, x, y = read_split(data, split, problem)
    out = predict_outputs(model, x, problem, device=device, batch=batch)
    metrics = score(problem.task, out, y, info)
    if save:
        with h5py.File(save, "w") as f:
            f.create_dataset("probabilities" if problem.task in CLASS_TASKS else "predictions", data=out)
            if problem.task == "segmentation":  # the map itself: the most probable class per pixel
                f.create_dataset("labels", data=out.argmax(1).astype(np.int64))
            f.create_dataset("y", data=y)
            f.attrs["model"] = str(model_dir(model_path).path)
            f.attrs["data"], f.attrs["split"] = str(data), split
    return {"split": split, "task": problem.task, **metrics}


# -- ensembles ---------------------------------------------------------------------------------------------------
def _device(comm: Any, members: int) -> str:
    """Collective: this rank's device: its GPU by node-local rank, else (several ranks) its share of the node's cores.

    Ranks that the launcher already bound to disjoint cores (srun --cpu-bind, mpiexec --cpu-bind) keep their cores;
    ranks that share the node's cores split them as workers do (launch.placement.node_placement, the one rule for
    both). Idle ranks (no member) get no share. A GPU that this torch build cannot drive (a CPU-only build on a GPU
    node) leaves the rank on the CPU.
    """
    from galapagos.launch.placement import node_placement, place

    if comm is None or comm.Get_size() == 1:
        device = place(0, 1).device
    else:
        from galapagos.launch.mpi import node_comm

        node = node_comm(comm)
        try:
            p = node_placement(node, comm.Get_rank(), comm.Get_rank() < members)
        finally:
            node.Free()
        if p is None:
            return "cpu"
        device = p.device
        if device == "cpu" and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, p.cores)
            except OSError as exc:
                log.warning("could not bind to cores %s: %s", p.cores, exc)
            torch.set_num_threads(p.threads)
    backend = getattr(torch, device.partition(":")[0], None)
    if device != "cpu" and not (backend is not None and backend.is_available()):
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
            model, _, problem = load_network(EnsembleDir(root).member(used[i].name), device)
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
    if avg.task in CLASS_TASKS:  # means over samples (and pixels)
        return {"entropy": float(avg.entropy.mean()) if len(avg.entropy) else float("nan"),
                "mutual_information": float(avg.mutual_information.mean()) if len(avg.entropy) else float("nan")}
    std = avg.std.reshape(len(avg.std), avg.std.shape[1], -1)  # (N, T, pixels); one pixel for regression
    per = std.mean((0, 2)) if len(std) else np.full(std.shape[1], np.nan)
    names = list(info.target_names) if info.target_names else [f"target_{i}" for i in range(len(per))]
    return {"std": float(per.mean()), "per_target": {n: {"std": float(v)} for n, v in zip(names, per)}}


def _save(path: str | Path, avg: Averaged, y: np.ndarray, info: DatasetInfo, *, root, data, split, names,
          weights) -> None:
    """Predictions and uncertainties per sample, each member's outputs, the truth, and where they came from."""
    classes = avg.task in CLASS_TASKS
    with h5py.File(path, "w") as f:
        f.create_dataset("probabilities" if classes else "predictions", data=avg.mean)
        if avg.task == "segmentation":
            f.create_dataset("labels", data=avg.mean.argmax(1).astype(np.int64))
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


def pick_network(run: str | Path, spec: str) -> str:
    """`--model RUN --pick SPEC`: the directory of the member of the run's Pareto front that SPEC names."""
    rundir = RunDir(run)
    try:
        front = rundir.read_front()
    except RunDirError as exc:
        raise UsageError(f"--pick: {exc}") from None
    if front is None:
        raise UsageError(f"--pick: {run} has no {rundir.pareto.name}: only the directory of a run with several "
                         "[evolution] objectives keeps a Pareto front")
    members = front["members"]
    try:
        chosen = best_pick([SimpleNamespace(**m, metrics={"latency_ms": m["latency_ms"]}) for m in members], spec)
    except (KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--pick: unreadable {rundir.pareto}: {exc!r}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if chosen is None:
        front = "; ".join(f"id {m['id']}: fitness {m['fitness']:.4f}, params {m['params']}, latency_ms "
                          f"{m['latency_ms'] if m['latency_ms'] is None else round(m['latency_ms'], 3)}"
                          for m in members)
        raise UsageError(f"--pick {spec}: no network on the Pareto front of {run} meets it; the front holds {front}")
    return str(rundir.front_member(vars(chosen)))


def used_members(path: str | Path) -> int | None:
    """How many members predicting with `path` averages; None when it is a single network, not an ensemble."""
    return len(load_manifest(path).used) if is_ensemble(path) else None


def check(opts: PredictOptions) -> tuple[PredictOptions, int | None]:
    """The options to run with (--pick resolved to its network) and the ensemble's member count (None: one network).
    Bad input raises here, before any rank starts."""
    if opts.pick is not None:
        opts = dataclasses.replace(opts, model=pick_network(opts.model, opts.pick), pick=None)
    if opts.batch < 1:
        raise UsageError(f"--batch {opts.batch}: must be at least 1")
    if opts.ranks is not None and opts.ranks < 1:
        raise UsageError(f"--workers {opts.ranks}: must be at least 1")
    if opts.save and not Path(opts.save).absolute().parent.is_dir():
        raise UsageError(f"--save {opts.save}: directory {Path(opts.save).absolute().parent} does not exist")
    return opts, used_members(opts.model)  # an ensemble's manifest is checked here too


def plan(opts: PredictOptions) -> tuple[PredictOptions, int]:
    """A prediction started as one process: its options and how many ranks it needs (one for a single network, else
    up to one per member)."""
    from galapagos.flows.mpijob import default_workers

    opts, members = check(opts)
    if members is None:
        if opts.ranks and opts.ranks > 1:
            log.warning("--workers %d ignored: %s is one network, not an ensemble", opts.ranks, opts.model)
        return opts, 1
    ranks = min(opts.ranks or default_workers(), members)
    if ranks > 1:
        log.info("averaging %d member(s) over %d ranks", members, ranks)
    return opts, ranks


def collective(comm: Any, opts: PredictOptions) -> dict | None:
    """`predict` on every rank of `comm` (None: this process alone): one network on rank 0; an ensemble's members
    averaged over the ranks. The scores on rank 0, None on the others."""
    rank0 = comm is None or comm.rank == 0
    opts, members = check(opts)
    if members is None:
        if comm is not None and rank0 and opts.ranks and opts.ranks > 1:
            log.warning("--workers %d ignored: %s is one network, not an ensemble", opts.ranks, opts.model)
        return predict(opts.model, opts.data, opts.split, save=opts.save, batch=opts.batch) if rank0 else None
    if comm is not None and rank0 and opts.ranks and min(opts.ranks, members) != comm.size:
        log.warning("--ranks %d ignored: this job has %d rank(s)", opts.ranks, comm.size)
    return predict_ensemble(opts.model, opts.data, opts.split, comm=comm if comm and comm.size > 1 else None,
                            save=opts.save, batch=opts.batch, per_member=opts.member_outputs)


# Every rank runs it (galapagos.flows.mpijob, FlowRef(collective=True)): no master, no workers.
FLOW = Flow("predict", check=check, master=collective, plan=plan)
