"""Run across the namespace cluster: share an HDF5 file's train split with datashare and, while every rank holds its
node's copy, say where that copy lives; the test looks into each node from outside meanwhile.

    cluster_share.py FILE HOLD_DIR

Rank 0 prints SHARED [one object per rank] (gathered: Hydra interleaves several ranks' output): each rank's host,
the device and inode of the segment it maps (fstat of its descriptor), the device of the /dev/shm it sees, the
segment's name and a digest of each array it reads. Rank 0 then writes HOLD_DIR/holding and every rank waits until
HOLD_DIR/release exists (at most 60 s) before letting go.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from galapagos.datashare.plan import dataset_plan
from galapagos.datashare.share import share
from galapagos.launch.mpi import node_comm, world

path, hold = sys.argv[1], Path(sys.argv[2])
comm = world()
node = node_comm(comm)
plan = dataset_plan(path, ("train",))[0] if comm.rank == 0 else None
with share(comm, node, plan) as got:
    desc = got.descriptor()
    st = os.fstat(desc["fd"])
    digests = {k: hashlib.blake2b(a.tobytes(), digest_size=16).hexdigest() for k, a in got.arrays.items()}
    reports = comm.gather({"rank": comm.rank, "host": socket.gethostname(), "dev": st.st_dev, "ino": st.st_ino,
                           "shm_dev": os.stat("/dev/shm").st_dev, "name": desc["name"], "digests": digests}, root=0)
    if comm.rank == 0:
        print("SHARED " + json.dumps(reports), flush=True)
    comm.Barrier()
    if comm.rank == 0:
        (hold / "holding").write_text("1")
    deadline = time.time() + 60
    while not (hold / "release").exists() and time.time() < deadline:
        time.sleep(0.05)
    comm.Barrier()
node.Free()
