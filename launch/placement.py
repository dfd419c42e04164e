"""Where a worker trains: its GPU (by node-local rank) or its even share of the node's CPU cores."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    cores: tuple[int, ...]  # cores the trainer child is bound to
    local_index: int  # this worker among the workers of its node
    local_workers: int


def gpu_count() -> int:
    """GPUs visible to this process, without initialising CUDA in the MPI rank (the trainer child does that)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len([d for d in os.listdir("/proc/driver/nvidia/gpus")])
    except OSError:
        return 0


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity where the system has one)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def place(local_index: int, local_workers: int, *, allowed: list[int] | None = None,
          gpus: int | None = None) -> Placement:
    """Split the node between its workers: one GPU each if there are GPUs, else an even share of the cores.

    With more workers than cores, workers share cores round-robin rather than leaving any with none.
    """
    if allowed is None:
        allowed = allowed_cores()
    gpus = gpu_count() if gpus is None else gpus
    n = len(allowed)
    if local_workers <= n:
        lo, hi = local_index * n // local_workers, (local_index + 1) * n // local_workers
        cores = tuple(allowed[lo:hi])
    else:
        cores = (allowed[local_index % n],)
    device = f"cuda:{local_index % gpus}" if gpus else "cpu"
    return Placement(device, cores, local_index, local_workers)
