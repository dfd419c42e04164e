"""The `[data]` table and how an evolution run's data reaches its workers: the memory plan stated before the ranks
start (datashare/budget.py), refused with the numbers when no mode fits, and the plan, the workers' request and
the trainers' access of the mode chosen."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from galapagos.datashare.budget import MODES, MemoryPlan, chunk_rows, memory_plan
from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.plan import DataShareError, dataset_plan
from galapagos.datashare.stream import partial_plan, worker_want
from galapagos.errors import UsageError
from galapagos.evolve.settings import Check, Table
from galapagos.evolve.task import DEVICE_MODES, DataAccess

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataConfig(Table):
    """The `[data]` table: how the training split is held (resident, sharded over nodes, or streamed)."""

    section = "data"
    choices = {"mode": MODES, "device": DEVICE_MODES}

    mode: str = "auto"  # auto: resident if it fits the node's shared memory, else shard (several nodes), else stream
    shm_limit_mib: int = 0  # shared memory a node may use; 0 = GALAPAGOS_SHM_LIMIT_MIB if set, else /dev/shm free
    chunk_mib: int = 16  # stream: MiB of samples per chunk read from the file
    buffer_chunks: int = 4  # stream: chunks a worker reads ahead (its bounded buffer)
    device: str = "auto"  # on a GPU: the training split moved whole, or batches through pinned buffers; auto: by size
    nodes: int = 0  # nodes holding workers (the shard and memory plans); 0 = from the launcher's environment

    def checks(self) -> list[Check]:
        return [("shm_limit_mib", self.shm_limit_mib >= 0, "at least 0 (0 = GALAPAGOS_SHM_LIMIT_MIB or /dev/shm)"),
                ("chunk_mib", self.chunk_mib >= 1, "at least 1"),
                ("buffer_chunks", self.buffer_chunks >= 1, "at least 1"),
                ("nodes", self.nodes >= 0, "at least 0 (0 = from the environment)")]


def worker_nodes(workers: int, setting: int = 0) -> int:
    """Nodes that hold workers: the setting, else GALAPAGOS_RANKS_PER_NODE's groups (rank 0's group holds workers
    unless it is alone), else the batch job's node count (Slurm, Flux, PBS), else one: a plan for one node is the
    cautious one (sharding over fewer nodes puts more on each), so a launcher that says nothing (Hydra's mpiexec
    with a host file) gets `[data] nodes`, or that."""
    if setting:
        return setting
    per_node = int(os.environ.get("GALAPAGOS_RANKS_PER_NODE", "0") or 0)
    if per_node > 0:
        return workers if per_node == 1 else -(-(workers + 1) // per_node)
    for var in ("SLURM_JOB_NUM_NODES", "FLUX_JOB_NNODES"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var]) or 1
    if nodefile := os.environ.get("PBS_NODEFILE"):  # one line per node (or per slot): the distinct names
        try:
            return len({line.strip() for line in open(nodefile) if line.strip()}) or 1
        except OSError:
            pass
    return 1


def data_memory(data: DataConfig, run: Any, info: DatasetInfo, workers: int) -> MemoryPlan:
    """The memory plan of a run (UsageError with the numbers when nothing fits)."""
    try:
        return memory_plan(info, data.mode, workers=workers, nodes=worker_nodes(workers, data.nodes),
                           limit_mib=data.shm_limit_mib, val_fraction=run.val_fraction, seed=run.seed,
                           chunk_mib=data.chunk_mib, depth=data.buffer_chunks)
    except DataShareError as exc:
        raise UsageError(str(exc)) from None


def data_setup(data: DataConfig, run: Any, path: str, info: DatasetInfo, workers: int
               ) -> tuple[Any, dict, DatasetInfo, DataAccess, dict | None]:
    """Rank 0: the plan, its in-memory arrays, the info, the trainers' access and the workers' request."""
    memory = data_memory(data, run, info, workers)
    log.info("data: %s mode (data.mode %s); %s", memory.mode, data.mode, memory.describe())
    kw = dict(val_fraction=run.val_fraction, seed=run.seed, chunk_bytes=run.chunk_mib << 20,
              readers=run.readers or "node")
    if memory.mode == "resident":
        plan, arrays, info = dataset_plan(path, ("train", "val"), **kw)
        return plan, arrays, info, DataAccess(device=data.device), None
    plan, arrays, info, spec = partial_plan(path, memory.mode, chunk_rows=chunk_rows(info, data.chunk_mib),
                                            depth=data.buffer_chunks, **kw)
    access = DataAccess(spec if memory.mode == "stream" else None, data.device)
    return plan, arrays, info, access, worker_want(memory.mode, arrays)
