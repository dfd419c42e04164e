"""The memory a run's data needs per node in each mode, against what the node has; stated before any rank starts.

- ``resident``: the training and validation splits in one shared-memory copy per node (and, on a GPU, moved
  whole into every worker's device memory when they fit there; else batches stream through pinned buffers).
- ``shard``: validation whole, and this node's even share of the file's training rows (nodes that hold workers).
- ``stream``: validation whole in shared memory; each worker reads chunks of the training split from the file
  into a buffer of ``depth`` chunks ahead, plus the chunk in use and a batch carried over (process memory).

The shared-memory limit of a node is ``shm_limit`` bytes if set (``[data] shm_limit_mib``, or the environment
variable GALAPAGOS_SHM_LIMIT_MIB), else the free space of /dev/shm; the host memory for stream buffers is the
node's available memory (MemAvailable of /proc/meminfo, https://docs.kernel.org/filesystems/proc.html).
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import numpy as np

from .carve import carve_indices
from .format import DatasetInfo, y_dtype
from .plan import DataShareError
from .shm import SHM_DIR, _gib, free_bytes

__all__ = ["MODES", "ENV_LIMIT", "MemoryPlan", "memory_plan", "shm_limit", "chunk_rows"]

MODES = ("auto", "resident", "shard", "stream")
ENV_LIMIT = "GALAPAGOS_SHM_LIMIT_MIB"


def shm_limit(limit_mib: int = 0) -> tuple[int, str]:
    """Bytes of shared memory a node may use for the data, and where that figure comes from."""
    free = free_bytes()
    for value, origin in ((limit_mib, "data.shm_limit_mib"), (os.environ.get(ENV_LIMIT, ""), ENV_LIMIT)):
        try:
            mib = int(value or 0)
        except ValueError:
            raise DataShareError(f"{origin}={value!r}: expected a whole number of MiB") from None
        if mib > 0:
            return (mib << 20, origin) if mib << 20 <= free else (free, f"{SHM_DIR} free space, below {origin}")
    return free, f"{SHM_DIR} free space"


def host_available() -> int:
    """Bytes of memory the node can still give processes (MemAvailable), or its free pages where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def chunk_rows(info: DatasetInfo, chunk_mib: int) -> int:
    """Rows per streamed chunk: ``chunk_mib`` MiB of samples, at least one."""
    return max(1, (chunk_mib << 20) // _row_bytes(info))


def _row_bytes(info: DatasetInfo) -> int:
    x = math.prod(info.sample_shape) * np.dtype(info.x_dtype).itemsize
    return x + y_dtype(info.task).itemsize * math.prod(info.y_sample_shape)  # a label per pixel for dense tasks


@dataclass(frozen=True)
class MemoryPlan:
    """Per node: bytes of shared memory and of worker buffers each mode needs, the node's room, the mode chosen."""

    mode: str
    asked: str
    nodes: int  # nodes that hold workers
    workers_per_node: int
    limit: int
    limit_from: str
    host_free: int
    needs: dict  # mode -> (shared bytes, worker buffer bytes) per node
    gpu_per_worker: int  # device bytes per worker with both splits moved whole (the resident mode on a GPU)

    def fits(self, mode: str) -> bool:
        shared, buffers = self.needs[mode]
        return shared <= self.limit and buffers <= self.host_free

    def describe(self) -> str:
        parts = [f"{m} {_gib(s)} shared" + (f" + {_gib(b)} worker buffers" if b else "")
                 for m, (s, b) in self.needs.items()]
        return (f"per node ({self.nodes} node(s) with workers, {self.workers_per_node} worker(s) each): "
                f"{'; '.join(parts)}; the node has {_gib(self.limit)} of shared memory ({self.limit_from}) and "
                f"{_gib(self.host_free)} available; on a GPU the resident data is {_gib(self.gpu_per_worker)} "
                "per worker (streamed through pinned buffers where it does not fit)")


def memory_plan(info: DatasetInfo, asked: str = "auto", *, workers: int = 1, nodes: int = 1, limit_mib: int = 0,
                val_fraction: float = 0.1, seed: int = 0, chunk_mib: int = 16, depth: int = 4) -> MemoryPlan:
    """The memory each mode needs for ``info``'s file (as inspected: its own splits), and the mode to run.

    ``auto`` takes the first that fits of resident, shard (more than one node) and stream; a mode that does not
    fit raises :class:`DataShareError` with the numbers."""
    if asked not in MODES:
        raise DataShareError(f"data.mode: expected one of {', '.join(MODES)}, got {asked!r}")
    row, n = _row_bytes(info), info.splits["train"]
    if "val" in info.splits:
        val, carved = info.splits["val"] * row, 0
    else:
        try:
            _, val_idx = carve_indices(n, val_fraction=val_fraction, seed=seed)
        except ValueError as exc:
            raise DataShareError(f"{info.path}: /train: {exc}") from None
        val, carved = len(val_idx) * row, n  # carved: rows of the train mask (1 byte each)
    nodes = max(1, nodes)
    per_node = max(1, -(-workers // nodes))
    limit, origin = shm_limit(limit_mib)
    chunk = min(chunk_rows(info, chunk_mib), n) * row
    needs = {"resident": (n * row + (val if "val" in info.splits else 8 * n), 0),
             "shard": (-(-n // nodes) * row + val + -(-carved // nodes), 0),
             "stream": (val + carved, per_node * (depth + 2) * chunk)}
    gpu = n * row + (val if "val" in info.splits else 0)
    plan = MemoryPlan("", asked, nodes, per_node, limit, origin, host_available(), needs, gpu)
    if asked == "auto":
        order = ("resident", "shard", "stream") if nodes > 1 else ("resident", "stream")
        mode = next((m for m in order if plan.fits(m)), None)
    else:
        mode = asked if plan.fits(asked) else None
    if mode is None:
        what = f"data.mode {asked} does not fit" if asked != "auto" else "no data.mode fits"
        raise DataShareError(f"{info.path}: {what}: {plan.describe()}; raise data.shm_limit_mib, use more "
                             "nodes, or lower data.chunk_mib / data.buffer_chunks")
    return dataclasses.replace(plan, mode=mode)
