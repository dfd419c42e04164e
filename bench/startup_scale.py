"""A whole machine's start, by a model built from measured pieces: from the first rank's start until every worker
has the data and its first task, at 10,000 nodes, against the wall time of an allocation.

    python -m bench.startup_scale [--nodes 10000] [--per-node 8] [--gib 1 16 100] [--hours 2 12]

The start is sequential on rank 0 (`launch/session.py: master_start`, then `master_serve`), and so is the model:

1. rank start: one rank imports what it runs before MPI is up (rank 0's flow and mpi4py) and meets the others at a
   barrier; measured here with 2 ranks, warm page cache. The launcher's spread over the nodes is not in it (a staged
   environment, `launch --stage`, keeps a cold file system out of it: bench/startup.py).
2. setup: rank 0 sends `Setup` to every worker, one `comm.send` each (measured: the real object, 2 ranks).
3. the world's collectives before the data moves: `node_comm` (an allgather of every rank's host name, then
   `Split`), the leaders' `Split` in `datashare.share`, and the leaders' allgathers of what each node needs. Each
   allgather over P ranks is modelled as recursive doubling: ceil(log2 P) hops of the measured small-message latency,
   P items through one link at the measured bandwidth, and P unpickles (mpi4py's lowercase allgather; measured).
4. the data: `datashare.share` cuts it into `chunk_bytes` pieces (64 MiB) and moves each to every node leader. It
   takes its pipelined chain of the leaders while the chain's fill, (leaders - 2) x 4 MiB, is below the data, else
   MPI's `Bcast` (the same test as `datashare.share._transfer`). The chain costs (blocks + leaders - 2) hops of a
   4 MiB block; `Bcast` is modelled as a binomial tree, ceil(log2 leaders) hops of a whole chunk per chunk (what MPICH
   does below 8 ranks and for short messages; its scatter + allgather for long ones costs about two hops of the data
   whatever the depth, `bcast_long` beside it). The hop costs are measured: one `Send`/`Recv` of a chunk (and of a
   chain block) between two ranks of this machine. The real `share` over 2 and 3 ranks made single-rank nodes
   (GALAPAGOS_RANKS_PER_NODE=1), from memory, checks the hop model against the code itself (`share_check`).
5. the first round: rank 0 breeds and sends every worker its first task; measured with the real engine and master
   on simulated workers (`bench/scale.py`'s ramp at nodes x per-node workers), or given with `--ramp`.

A hop on this machine is shared memory between two processes, not a network link: on a fabric a hop's latency is
higher and its bandwidth is a NIC's (Slingshot: about 2 us and 25 GB/s). `--latency-us` and `--link-gbs` put a
fabric's figures in the model instead of the measured ones. The file system's read is not modelled: the readers read
ahead while earlier pieces travel (datashare.share DEPTH), so the links set the pace.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CHUNK = 64 << 20  # datashare.plan.Plan.chunk_bytes' default
NAME_BYTES = 40  # a host name as mpi4py pickles it for node_comm's allgather


# -- measured on this machine, under mpiexec -------------------------------------------------------------------
def probe(share_mib: int) -> None:
    """Every rank of a small job: hop costs and Setup sends between ranks 0 and 1; then the real share of
    `share_mib` MiB over all ranks as single-rank nodes. Rank 0 prints one JSON line."""
    import galapagos.flows.evolution  # noqa: F401 - what rank 0 imports before MPI is up
    import galapagos.launch.session  # noqa: F401 - and every worker
    from galapagos.datashare.plan import Plan
    from galapagos.datashare.share import CHAIN_BLOCK, share
    from galapagos.launch.mpi import node_comm, world
    from galapagos.launch.protocol import Setup

    comm = world()
    rank, out = comm.Get_rank(), {}
    comm.Barrier()
    out["start_s"] = time.time() - float(os.environ["STARTUP_T0"])  # from mpiexec to every rank past a barrier
    pair = comm.Split(0 if rank < 2 else 1, rank)  # ranks 0 and 1 measure; a third waits
    if rank < 2:
        peer = 1 - rank
        out["latency_us"] = 1e6 * _pingpong(pair, rank, peer, None, 2000)
        for name, size in (("hop_chunk_s", CHUNK), ("hop_block_s", CHAIN_BLOCK)):
            out[name] = _pingpong(pair, rank, peer, np.ones(size, np.uint8), 5)
        setup = Setup("galapagos.evolve.train:train_task", log_dir="/lustre/project/run/log")
        n = 5000
        pair.Barrier()
        t = time.perf_counter()
        for _ in range(n):
            if rank == 0:
                pair.send(setup, dest=1, tag=7)
            else:
                pair.recv(source=0, tag=7)
        out["setup_send_us"] = 1e6 * (time.perf_counter() - t) / n
    pair.Free()
    comm.Barrier()
    os.environ["GALAPAGOS_RANKS_PER_NODE"] = "1"
    node = node_comm(comm)
    out["share_s"] = []
    for mib in (share_mib // 4, share_mib):  # two sizes: the slope is a hop's cost per byte, without fixed costs
        memory = {"train/x": np.ones(mib << 20, np.uint8)} if rank == 0 else None
        plan = Plan.of_arrays(memory, chunk_bytes=CHUNK) if rank == 0 else None
        comm.Barrier()
        t = time.perf_counter()
        with share(comm, node, plan, memory=memory):
            comm.Barrier()
            out["share_s"].append(time.perf_counter() - t)
    node.Free()
    if rank == 0:
        out["ranks"] = comm.Get_size()
        print(json.dumps(out), flush=True)


def _pingpong(comm, rank: int, peer: int, buf, n: int) -> float:
    """One-way seconds of a message (half a round trip): `buf` by Send/Recv, None a small pickled object."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(n):
        if rank == 0:
            comm.send(1, dest=peer, tag=5) if buf is None else comm.Send(buf, dest=peer, tag=5)
            comm.recv(source=peer, tag=5) if buf is None else comm.Recv(buf, source=peer, tag=5)
        else:
            comm.recv(source=peer, tag=5) if buf is None else comm.Recv(buf, source=peer, tag=5)
            comm.send(1, dest=peer, tag=5) if buf is None else comm.Send(buf, dest=peer, tag=5)
    return (time.perf_counter() - t) / n / 2


def measure(ranks: int, share_mib: int) -> dict:
    from galapagos.launch.mpi import mpiexec

    env = {**os.environ, "STARTUP_T0": repr(time.time()), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "bench.startup_scale", "--probe", "--share-mib",
           str(share_mib)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def unpickle_us(items: int = 200_000) -> float:
    """Microseconds to unpickle one rank's host name: what mpi4py's allgather does P times on every rank."""
    blobs = [pickle.dumps(f"frontier{i:05d}.frontier.olcf.ornl.gov") for i in range(items)]
    t = time.perf_counter()
    for b in blobs:
        pickle.loads(b)
    return 1e6 * (time.perf_counter() - t) / items


def ramp(workers: int, per_node: int) -> float:
    """Seconds of the real master's first round over `workers` simulated workers (bench/scale.py)."""
    code = ("import json; from bench.scale import one; "
            f"print(json.dumps(one({workers}, 0.5, 60.0, 0.6, per_node={per_node})))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench.scale at {workers} workers failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["ramp_seconds"]


# -- the model -------------------------------------------------------------------------------------------------
def hop(nbytes: int, latency: float, seconds_per_byte: float) -> float:
    return latency + nbytes * seconds_per_byte


def allgather(p: int, item: int, latency: float, per_byte: float, unpickle: float) -> float:
    return math.ceil(math.log2(max(p, 2))) * latency + p * item * per_byte + p * unpickle


def data_seconds(nbytes: int, leaders: int, latency: float, per_byte: float) -> dict:
    """The data to every node leader as datashare.share moves it: its chain, or MPI's Bcast as a binomial tree
    (`data_s`), and as MPICH's long-message scatter + ring allgather (`bcast_long_s`: the chain where it is taken)."""
    from galapagos.datashare.share import CHAIN_BLOCK

    chunks = math.ceil(nbytes / CHUNK)
    depth = math.ceil(math.log2(max(leaders, 2)))
    block = CHUNK if leaders == 2 else min(CHUNK, CHAIN_BLOCK)  # as datashare.share._transfer
    headers = chunks * depth * latency  # each piece's header (its checksums), a small bcast
    if (leaders - 2) * block < nbytes:
        chain = headers + (math.ceil(nbytes / block) + leaders - 2) * hop(block, latency, per_byte)
        return {"data_s": chain, "data_path": "chain", "bcast_long_s": chain}
    tree = headers + chunks * depth * hop(CHUNK, latency, per_byte)
    long = headers + chunks * (2 * hop(CHUNK, 0.0, per_byte) + (depth + leaders - 1) * latency)
    return {"data_s": tree, "data_path": f"Bcast, depth {depth}", "bcast_long_s": long}


def model(nodes: int, per_node: int, gib: float, measured: dict, latency: float, per_byte: float, ramp_s: float,
          unpickle: float) -> dict:
    ranks = nodes * per_node + 1
    nbytes = int(gib * 2**30)
    phases = {"rank start": measured["start_s"],
              "setup sends": (ranks - 1) * measured["setup_send_us"] * 1e-6,
              # node_comm: allgather of names + Split (an allgather of two ints); the leaders' Split; the leaders'
              # allgathers of their needs and ranks, and their two agreements on errors
              "collectives": (allgather(ranks, NAME_BYTES, latency, per_byte, unpickle)
                              + 2 * allgather(ranks, 8, latency, per_byte, 0.0)
                              + 4 * allgather(nodes, 64, latency, per_byte, unpickle))}
    data = data_seconds(nbytes, nodes, latency, per_byte)
    phases["data"] = data["data_s"]
    phases["first round"] = ramp_s
    total = sum(phases.values())
    return {"nodes": nodes, "workers": ranks - 1, "gib": gib, **{k: round(v, 2) for k, v in phases.items()},
            "total_s": round(total, 1), "data_path": data["data_path"], "bcast_long_s": round(data["bcast_long_s"], 2),
            "total_long_s": round(total - data["data_s"] + data["bcast_long_s"], 1)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m bench.startup_scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--per-node", type=int, default=8, help="workers per node (Frontier 8 GCDs, Aurora 12 tiles)")
    ap.add_argument("--gib", type=float, nargs="+", default=[1.0, 16.0, 100.0], help="dataset sizes")
    ap.add_argument("--hours", type=float, nargs="+", default=[2.0, 12.0], help="allocation wall times")
    ap.add_argument("--ramp", type=float, default=None, help="the first round's seconds (default: measured)")
    ap.add_argument("--latency-us", type=float, default=None, help="a hop's latency (default: measured)")
    ap.add_argument("--link-gbs", type=float, default=None, help="a hop's bandwidth in GB/s (default: measured)")
    ap.add_argument("--share-mib", type=int, default=256, help="data of the real share() check")
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)  # a rank of the measuring job
    args = ap.parse_args(argv)
    if args.probe:
        probe(args.share_mib)
        return []
    two, three = measure(2, args.share_mib), measure(3, args.share_mib)
    share_bytes = args.share_mib << 20
    link_bw = CHUNK / (two["hop_chunk_s"] - two["latency_us"] * 1e-6)  # Send/Recv alone, hot buffers
    # one hop as the real share makes it (read, sent, received into a new segment, verified), less its fixed costs
    hop_bw = (share_bytes - (args.share_mib // 4 << 20)) / (two["share_s"][1] - two["share_s"][0])
    latency = 1e-6 * (args.latency_us if args.latency_us is not None else two["latency_us"])
    per_byte = 1.0 / (1e9 * args.link_gbs if args.link_gbs else hop_bw)
    check = {"share_mib": args.share_mib,
             "real_share_2_ranks_s": round(two["share_s"][1], 3),
             "real_share_3_ranks_s": round(three["share_s"][1], 3),
             "link_only_2_ranks_s": round(data_seconds(share_bytes, 2, latency, 1 / link_bw)["data_s"], 3),
             "model_3_ranks_s": round(data_seconds(share_bytes, 3, latency, 1 / hop_bw)["data_s"], 3)}
    ramp_s = args.ramp if args.ramp is not None else ramp(args.nodes * args.per_node, args.per_node)
    unpickle = 1e-6 * unpickle_us()
    print(json.dumps({"measured": {**two, "link_gbs": round(link_bw / 1e9, 2), "share_hop_gbs": round(hop_bw / 1e9,
                                                                                                       2),
                                   "unpickle_us":
                                   round(unpickle * 1e6, 3), "ramp_s": ramp_s}, "share_check": check}), flush=True)
    rows = [model(args.nodes, args.per_node, gib, two, latency, per_byte, ramp_s, unpickle) for gib in args.gib]
    print(f"\nmodel: latency {latency * 1e6:.1f} us, {1 / per_byte / 1e9:.2f} GB/s per hop; seconds")
    print("| nodes | workers | data | rank start | setup sends | collectives | data | path | first round | total "
          + "".join(f"| of {h:g} h " for h in args.hours) + "| data, MPICH long Bcast | total | "
          + "".join(f"of {h:g} h | " for h in args.hours))
    print("|---" * (12 + 2 * len(args.hours)) + "|")
    for r in rows:
        print(f"| {r['nodes']:,} | {r['workers']:,} | {r['gib']:g} GiB | {r['rank start']} | {r['setup sends']} | "
              f"{r['collectives']} | {r['data']} | {r['data_path']} | {r['first round']} | {r['total_s']} "
              + "".join(f"| {100 * r['total_s'] / (3600 * h):.2f}% " for h in args.hours)
              + f"| {r['bcast_long_s']} | {r['total_long_s']} | "
              + "".join(f"{100 * r['total_long_s'] / (3600 * h):.2f}% | " for h in args.hours))
    return rows


if __name__ == "__main__":
    main()
