"""Averaged inference of an ensemble, over the ranks of an MPI communicator or in one process.

Rank r holds members r, r + size, ... of the members used. Rank 0 holds the split; each batch reaches every rank
with a buffer ``Bcast`` (raw bytes, no pickling; other ranks hold one batch buffer, never the split), every rank
runs its members on it, and one ``Reduce(SUM)`` per batch brings rank 0 a packed float64 buffer:

    [ sum_m w_m o_m  (B, K) | sum_m w_m o_m**2 (B, K) for regression, or sum_m w_m H(o_m) (B,) for classes |
      o_m in member m's slot, zeros elsewhere (M, B, K) ]

The first two blocks are the weighted moments: the mean prediction, the between-member spread and (classes) the
mutual information follow from them, and their size does not grow with the member count. The third block carries
each member's own outputs (exactly: float32 values summed with zeros), which the per-member metrics and ``--save``
need; ensembles are small enough (tens of members) that it costs little next to the forward passes, and
``per_member=False`` drops it where M x K is large.

For the dense tasks every block has the sample's spatial axes too: (B, K, *spatial) probabilities or target
channels per pixel, and entropies (B, *spatial) per pixel.

``comm=None`` runs the same code in one process; only the reduction differs. This module never imports mpi4py:
callers pass a communicator with mpi4py semantics (``Get_rank``, ``bcast``, ``Bcast``, ``Reduce``, ``Split``).
"""
from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from galapagos.datashare.layout import MAX_COUNT
from galapagos.datashare.rules import CLASS_TASKS

log = logging.getLogger(__name__)

__all__ = ["Averaged", "assigned", "average", "first_error", "member_output"]

#: largest piece of one batch's bytes sent in one Bcast call
CHUNK_BYTES = min(64 << 20, MAX_COUNT)


@dataclass(frozen=True)
class Averaged:
    """The ensemble's predictions on rank 0: weighted mean and uncertainty per sample, and each member's outputs."""

    task: str
    mean: np.ndarray  # (N, K) float64: mean class probabilities, or mean regression outputs
    std: np.ndarray | None  # regression (N, T): weighted between-member standard deviation
    entropy: np.ndarray | None  # classification (N,): entropy of the mean probabilities, nats
    mutual_information: np.ndarray | None  # classification (N,): entropy of the mean - mean member entropy
    members: np.ndarray | None  # (M, N, K) float32 per-member outputs (None with per_member=False)
    ranks: int  # ranks that held members


def assigned(count: int, rank: int, size: int) -> range:
    """Indices of the members rank `rank` of `size` holds: round robin, so ranks differ by one member at most."""
    return range(rank, count, size)


def first_error(comm: Any, error: BaseException | None) -> BaseException | None:
    """Collective: the lowest rank's exception, on every rank, so that all ranks stop together and none hangs.

    The rank that raised it gets its own exception back (traceback intact); the others get one of the same class
    and message (a RuntimeError where the class cannot travel or be rebuilt from the message).
    """
    if comm is None or comm.Get_size() == 1:
        return error
    mine = None if error is None else (type(error), str(error))
    try:
        pickle.dumps(mine)
    except Exception:  # noqa: BLE001 - e.g. a class defined inside a function
        mine = (RuntimeError, f"{type(error).__name__}: {error}")
    for rank, found in enumerate(comm.allgather(mine)):
        if found is None:
            continue
        if rank == comm.Get_rank():
            return error
        cls, message = found
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a constructor that wants other arguments
            return RuntimeError(message)
    return None


def member_output(model: torch.nn.Module, x: np.ndarray, task: str, device: str | torch.device = "cpu") -> np.ndarray:
    """One member on one batch: class probabilities (B, K) or regression outputs (B, T), float32 (per pixel for the
    dense tasks: (B, K, *spatial), (B, T, *spatial))."""
    with torch.inference_mode():
        out = model(torch.from_numpy(np.ascontiguousarray(x)).to(device)).float()
        return (out.softmax(1) if task in CLASS_TASKS else out).cpu().numpy()


def _entropy(p: np.ndarray) -> np.ndarray:
    """Entropy in nats along the class axis (axis 1: (B, K) or (B, K, *spatial); 0 log 0 = 0)."""
    p = np.asarray(p, dtype=np.float64)
    return -(p * np.log(np.where(p > 0, p, 1.0))).sum(1)


def _spread(task: str) -> bool:
    """Tasks whose members' spread is a standard deviation per output (regression, fields), not an entropy."""
    return task in ("regression", "field")


class _Layout:
    """Where each block lives in the packed per-batch buffer."""

    def __init__(self, task: str, b: int, k: int, m: int, per_member: bool, spatial: tuple[int, ...] = ()):
        self.shapes = {"s1": (b, k, *spatial), "s2": (b, k, *spatial) if _spread(task) else (b, *spatial)}
        if per_member:
            self.shapes["members"] = (m, b, k, *spatial)
        self.size = sum(int(np.prod(s)) for s in self.shapes.values())

    def views(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        out, start = {}, 0
        for name, shape in self.shapes.items():
            n = int(np.prod(shape))
            out[name] = buf[start:start + n].reshape(shape)
            start += n
        return out


def _bcast_batch(comm: Any, buf: np.ndarray) -> None:
    raw = buf.reshape(-1).view(np.uint8)
    for start in range(0, raw.nbytes, CHUNK_BYTES):
        comm.Bcast(raw[start:start + CHUNK_BYTES], root=0)


def _check_members(comm: Any, models: Sequence[tuple[int, Callable]], m: int, x: np.ndarray | None, rank: int,
                   size: int) -> None:
    """Collective: each rank holds the members :func:`assigned` to it and rank 0 the inputs, or every rank raises
    (none waits in a broadcast)."""
    expected, held = set(assigned(m, rank, size)), sorted(i for i, _ in models)
    error = None
    if set(held) != expected:
        error = ValueError(f"rank {rank} of {size} holds members {held}, expected {sorted(expected)}")
    elif rank == 0 and x is None:
        error = ValueError("rank 0 must pass the inputs, got None")
    if (error := first_error(comm, error)) is not None:
        raise error


def _member_sums(models: Sequence[tuple[int, Callable]], xb: np.ndarray, w: np.ndarray, task: str,
                 device: str | torch.device, lay: _Layout) -> np.ndarray:
    """This rank's members on one batch, packed as `lay` places them: their weighted moments and own outputs."""
    send = np.zeros(lay.size)
    part = lay.views(send)
    for i, model in models:
        o = member_output(model, xb, task, device)
        part["s1"] += w[i] * o
        part["s2"] += w[i] * (o.astype(np.float64) ** 2 if _spread(task) else _entropy(o))
        if "members" in part:
            part["members"][i] = o
    return send


def _averaged(task: str, out: dict[str, np.ndarray], size: int) -> Averaged:
    """The mean, and the spread (std) or the entropies, from the summed moments of every batch."""
    mean = out["mean"]
    if _spread(task):
        # E[o^2] - E[o]^2 in float64 from float32 outputs: cancellation stays below the outputs' own precision.
        std = np.sqrt(np.clip(out["second"] - mean ** 2, 0.0, None))
        return Averaged(task, mean, std, None, None, out.get("members"), size)
    entropy = _entropy(mean)
    mutual = np.clip(entropy - out["second"], 0.0, None)
    return Averaged(task, mean, None, entropy, mutual, out.get("members"), size)


def average(comm: Any, models: Sequence[tuple[int, Callable]], weights: Sequence[float], x: np.ndarray | None,
            task: str, num_outputs: int, *, batch: int = 1024, device: str | torch.device = "cpu",
            per_member: bool = True) -> Averaged | None:
    """Collective: the weighted average of all members' predictions on `x` (given on rank 0; None elsewhere).

    `models` are this rank's members as (index among the members used, module), as :func:`assigned` deals them;
    `weights` are all members' weights (summing to 1). Ranks beyond the member count take no part after one
    ``Split`` and get None, as do all ranks but 0.
    """
    if batch < 1:
        raise ValueError(f"batch size must be positive, got {batch}")
    m, k = len(weights), int(num_outputs)
    w = np.asarray(weights, dtype=np.float64)
    if comm is not None and comm.Get_size() > m:  # idle ranks: no member, no batches
        active = comm.Get_rank() < m
        sub = comm.Split(0 if active else 1, comm.Get_rank())
        if not active:
            sub.Free()
            return None
        try:
            return average(sub, models, weights, x, task, num_outputs, batch=batch, device=device,
                           per_member=per_member)
        finally:
            sub.Free()
    rank = 0 if comm is None else comm.Get_rank()
    size = 1 if comm is None else comm.Get_size()
    _check_members(comm, models, m, x, rank, size)
    meta = (len(x), x.shape[1:], x.dtype.str) if rank == 0 else None
    if comm is not None:
        meta = comm.bcast(meta, root=0)
    n, shape, dtype = meta
    xbuf = np.empty((min(batch, n), *shape), dtype=np.dtype(dtype))
    sp = tuple(shape[1:]) if task in ("segmentation", "field") else ()  # outputs per pixel keep x's spatial axes

    out: dict[str, np.ndarray] = {}
    if rank == 0:
        out["mean"] = np.empty((n, k, *sp))
        out["second"] = np.empty((n, k, *sp) if _spread(task) else (n, *sp))
        if per_member:
            out["members"] = np.empty((m, n, k, *sp), dtype=np.float32)
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        b = hi - lo
        xb = x[lo:hi] if rank == 0 else xbuf[:b]
        if comm is not None:
            if rank == 0:
                xb = np.ascontiguousarray(xb)
            _bcast_batch(comm, xb)
        lay = _Layout(task, b, k, m, per_member, sp)
        send = _member_sums(models, xb, w, task, device, lay)
        if comm is None:
            recv = send
        else:
            recv = np.empty_like(send) if rank == 0 else None
            comm.Reduce(send, recv, root=0)  # mpi4py's default op is SUM
        if rank == 0:
            got = lay.views(recv)
            out["mean"][lo:hi] = got["s1"]
            out["second"][lo:hi] = got["s2"]
            if per_member:
                out["members"][:, lo:hi] = got["members"]
    return _averaged(task, out, size) if rank == 0 else None
