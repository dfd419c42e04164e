"""Run under mpiexec with GALAPAGOS_RANKS_PER_NODE: rows asked for as NODE are split over the nodes that ask.

Rank 0 asks for nothing; every other rank asks for its node's rows of `a` and `b` and all of `c`. Rank 0 checks
that the nodes' rows are disjoint, cover `a` in order, and that `b` got the same rows; prints NODE_ROWS_OK.
"""
from __future__ import annotations

import numpy as np

from galapagos.datashare.plan import Plan
from galapagos.datashare.share import share
from galapagos.datashare.stream import NODE
from galapagos.launch.mpi import node_comm, world

comm = world()
node = node_comm(comm)
src = {"a": np.arange(101, dtype=np.int64), "b": np.arange(101, dtype=np.uint8), "c": np.arange(5.0)}
want = {} if comm.rank == 0 else {"a": NODE, "b": NODE, "c": None}
with share(comm, node, Plan.of_arrays(src, chunk_bytes=64), memory=src if comm.rank == 0 else None,
           want=want) as got:
    mine = (node.rank == 0 and comm.rank != 0, {k: np.array(v) for k, v in got.arrays.items()})
    seen = comm.gather(mine, root=0)
if comm.rank == 0:
    parts = [arrays for leader, arrays in seen if leader]
    assert len(parts) == comm.size - 1, parts
    assert np.array_equal(np.concatenate([p["a"] for p in parts]), src["a"]), parts
    assert all(np.array_equal(p["a"], p["b"]) and np.array_equal(p["c"], src["c"]) for p in parts), parts
    print("NODE_ROWS_OK")
node.Free()
