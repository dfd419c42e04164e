"""Run across the namespace cluster: each rank says where it runs and which ranks launch.mpi.node_comm groups it with.

Rank 0 prints one line, PLACED [{rank, host, processor, node: [world ranks of its node group]} for every rank]
(gathered: Hydra interleaves the output of several ranks within lines).
"""
from __future__ import annotations

import json
import socket

from mpi4py import MPI

from galapagos.launch.mpi import node_comm, world

comm = world()
node = node_comm(comm)
members = node.allgather(comm.rank)
placed = comm.gather({"rank": comm.rank, "host": socket.gethostname(), "processor": MPI.Get_processor_name(),
                      "node": members}, root=0)
if comm.rank == 0:
    print("PLACED " + json.dumps(placed), flush=True)
node.Free()
