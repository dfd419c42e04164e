"""Getting one dataset to every rank: each rank reading the file, datashare, and the copy floor, in one run.

    python -m bench.datashare --gib 1 --ranks 2 4 8

On the same HDF5 file (in the page cache, so the file system is not what is measured) and the same ranks:
(a) naive: every rank opens the file and reads every array itself; (b) datashare: rank 0 reads it once into the
node's shared copy that every rank maps; (b') the same with every rank pretending to be its own node
(GALAPAGOS_RANKS_PER_NODE=1), so each byte also crosses MPI to every "node" leader and is checksummed; (c) the
floor: one numpy.copyto of the same bytes into fresh memory, in one process. Reported: time until every rank can
read all of the data (each rank touches every page), bytes per second, and memory summed over ranks as
proportional set size (shared pages counted once across the ranks that map them) and as peak RSS.

    python -m bench.datashare --evolve-memory --gib 0.5 --workers 2

instead measures a real `galapagos evolve` job: PSS summed over all its processes while its trainers run, on the
file and on one 1/32 its size, so that what grows with the data shows as copies of the data on the node.

    python -m bench.datashare --cluster 2 4 8 --gib 0.5        (as root)

measures between nodes: on a cluster of namespace nodes (tests/cluster.py: each node its own network, hostname and
/dev/shm, veths to one bridge), the time until every node holds the data (one rank per node, started by Hydra
across the nodes, MPICH over TCP on the veths), against two plain TCP copies of the same bytes from node 0's
memory over the same veths in the same run: to one other node (the floor: no broadcast can beat one link's copy)
and to every other node at once (what a file server that sends each node its copy would do).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PAGE = 4096
PORT = 47213  # the plain TCP copies' port, inside the cluster's nodes (their own network namespaces)
REPO = Path(__file__).resolve().parent.parent


def _memory() -> tuple[int, int]:
    """(PSS, peak RSS) of this process in bytes."""
    pss = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    with open("/proc/self/status") as f:
        hwm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    return pss, hwm


def _touch(arrays) -> int:
    """Read one byte of every page, as training would: mapped data counts only once it is reachable."""
    total = 0
    for a in arrays.values():
        flat = np.asarray(a).reshape(-1).view(np.uint8)
        total += int(flat[::PAGE].sum())
    return total


def rank_main(mode: str, path: str, chunk_mib: int) -> None:
    """One rank of a measured job: get the data, touch it, report the time and memory."""
    from galapagos.datashare.format import open_file
    from galapagos.datashare.plan import array_name, dataset_plan
    from galapagos.datashare.share import share
    from galapagos.launch.mpi import node_comm, world

    comm = world()
    node = node_comm(comm)
    comm.Barrier()
    t0 = time.perf_counter()
    holder = None
    if mode == "naive":
        with open_file(path) as f:
            arrays = {array_name(g, k): f[g][k][()] for g in f for k in ("x", "y")}
    else:
        plan, memory = (dataset_plan(path, ("train",), chunk_bytes=chunk_mib << 20)[:2] if comm.rank == 0
                        else (None, None))
        holder = share(comm, node, plan, memory=memory)
        arrays = holder.arrays
    _touch(arrays)
    comm.Barrier()
    elapsed = time.perf_counter() - t0
    nbytes = sum(a.nbytes for a in arrays.values())
    pss, hwm = _memory()
    rows = comm.gather((elapsed, nbytes, pss, hwm), root=0)
    if comm.rank == 0:
        print("RESULT " + json.dumps({"seconds": max(r[0] for r in rows), "bytes": rows[0][1],
                                      "pss": sum(r[2] for r in rows), "peak_rss": sum(r[3] for r in rows)}))
    if holder is not None:
        holder.close()


def make_file(path: Path, gib: float) -> int:
    """A classification dataset of about `gib` GiB (float32 images), written in blocks."""
    from galapagos.datashare.write import write_dataset

    rows = int(gib * 2**30) // (4 * 64 * 64 * 4)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 4, 64, 64), dtype=np.float32)
    write_dataset(path, {"train": (x, rng.integers(0, 10, rows))}, task="classification", num_classes=10)
    return x.nbytes + rows * 8


def floor(nbytes: int, repeats: int = 3) -> dict:
    """Best of `repeats` copies into fresh memory (the first touch of a VM's memory is not what is measured)."""
    src = np.ones(nbytes, np.uint8)
    fresh = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst = np.empty_like(src)
        np.copyto(dst, src)
        fresh.append(time.perf_counter() - t0)
        del dst
    return {"seconds": min(fresh)}


def run(ranks: int, mode: str, path: Path, chunk_mib: int) -> dict:
    from galapagos.launch.mpi import mpiexec

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    if mode == "datashare-nodes":
        env["GALAPAGOS_RANKS_PER_NODE"] = "1"
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "bench.datashare", "--rank-mode",
           mode.split("-")[0], "--file", str(path), "--chunk-mib", str(chunk_mib)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(line[7:])


def _tree(root: int) -> list[int]:
    """The process ``root`` and all its descendants (mpiexec, the ranks, their trainer children)."""
    kids: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _pss(pid: int) -> tuple[int, int]:
    """(PSS of a process, the part of it in /dev/shm mappings), bytes; (0, 0) for a process that is gone."""
    total = shm = 0
    in_shm = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                    in_shm = "/dev/shm/" in line
                elif line.startswith("Pss:"):
                    kb = int(line.split()[1]) * 1024
                    total += kb
                    shm += kb if in_shm else 0
    except OSError:
        return 0, 0
    return total, shm


def evolve_memory(path: Path, out: Path, workers: int, evaluations: int) -> dict:
    """Summed PSS of every process of a real `galapagos evolve` job, sampled while all its trainers run."""
    config = out.with_suffix(".toml")  # tiny networks and batches: what grows with the data shows, not activations
    config.write_text("[space]\nmin_layers = 1\nmax_layers = 2\nchannels = [4]\nunits = [16]\nbatch_sizes = [32]\n"
                      "[train]\nepochs = 2\nmax_train_samples = 256\neval_batch_size = 64\n")
    cmd = [sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(path), "--out", str(out), "--config",
           str(config), "--workers", str(workers), "--evaluations", str(evaluations)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    samples = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        while proc.poll() is None:
            pids = _tree(proc.pid)
            trainers = [p for p in pids if b"galapagos.launch.trainer" in Path(f"/proc/{p}/cmdline").read_bytes()]
            if len(trainers) == workers:
                got = [_pss(p) for p in pids]
                samples.append((sum(t for t, _ in got), sum(s for _, s in got)))
            time.sleep(0.25)
        err = proc.stderr.read()
    if proc.returncode or not samples:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}, {len(samples)} samples):\n{err[-2000:]}")
    total, shm = sorted(t for t, _ in samples), sorted(s for _, s in samples)
    return {"median": total[len(total) // 2], "max": total[-1], "shm": shm[len(shm) // 2], "samples": len(samples)}


def memory_table(gib: float, workers: int, evaluations: int, tmp: Path) -> None:
    """The job on the file and on one 1/32 its size: what grows with the data is the data's copies on the node."""
    rows = []
    for label, size in (("small", gib / 32), ("large", gib)):
        path = tmp / f"{label}.h5"
        nbytes = make_file(path, size)
        rows.append((label, nbytes, evolve_memory(path, tmp / f"run-{label}", workers, evaluations)))
    print(f"`galapagos evolve`, {workers} workers, {evaluations} evaluations: PSS summed over every process")
    print("| file | data | samples | median | max | in /dev/shm (median) |")
    print("|---|---|---|---|---|---|")
    for label, nbytes, r in rows:
        print(f"| {label} | {nbytes / 2**30:.3f} GiB | {r['samples']} | {r['median'] / 2**30:.2f} GiB | "
              f"{r['max'] / 2**30:.2f} GiB | {r['shm'] / 2**30:.3f} GiB |")
    (_, small_bytes, small), (_, large_bytes, large) = rows
    grown = large_bytes - small_bytes
    print(f"copies of the data on the node (growth of summed PSS / growth of the data): median "
          f"{(large['median'] - small['median']) / grown:.2f}, max {(large['max'] - small['max']) / grown:.2f}")


def tcp_receive(nbytes: int) -> None:
    """In a node: take `nbytes` from one connection into fresh memory, touch them as `_touch` does, answer one byte."""
    listener = socket.create_server(("", PORT))
    print("listening", flush=True)
    conn, _ = listener.accept()
    buf = np.empty(nbytes, np.uint8)
    view, got = memoryview(buf), 0
    while got < nbytes:
        n = conn.recv_into(view[got:], min(nbytes - got, 8 << 20))
        if not n:
            raise SystemExit(f"{socket.gethostname()}: connection closed after {got} of {nbytes} bytes")
        got += n
    int(buf[::PAGE].sum())
    conn.sendall(b"k")
    conn.close()


def tcp_send(nbytes: int, hosts: list[str]) -> None:
    """In node 0: send `nbytes` from memory to every host at once (a thread each) and wait for each to answer."""
    import threading

    data = np.ones(nbytes, np.uint8)
    conns = [socket.create_connection((h, PORT)) for h in hosts]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=c.sendall, args=(memoryview(data),)) for c in conns]
    for t in threads:
        t.start()
    for t, c in zip(threads, conns):
        t.join()
        if c.recv(1) != b"k":
            raise SystemExit("a receiver did not confirm")
    print("RESULT " + json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def tcp_copy(cluster, nbytes: int, to: list[str]) -> float:
    """Seconds to copy `nbytes` from node 0's memory to each node in `to` at once over plain TCP."""
    me = [sys.executable, "-m", "bench.datashare", "--nbytes", str(nbytes)]
    receivers = [cluster.popen(h, [*me, "--tcp-receive"], cwd=REPO, stdout=subprocess.PIPE, text=True) for h in to]
    try:
        for r in receivers:
            assert r.stdout.readline().strip() == "listening"
        proc = cluster.run(0, [*me, "--tcp-send", *to], cwd=REPO, timeout=300)
        for r in receivers:
            r.wait(timeout=60)
    finally:
        for r in receivers:
            r.kill()
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"the TCP copy failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads(line[7:])["seconds"]


def between_nodes(nodes: list[int], gib: float, chunk_mib: int, repeats: int, tmp: Path) -> None:
    """The table for --cluster: datashare across n namespace nodes against plain TCP copies over the same veths."""
    sys.path.insert(0, str(REPO / "tests"))
    from cluster import Cluster, cluster_problem

    if (why := cluster_problem()) is not None:
        raise SystemExit(f"--cluster: {why}")
    path = tmp / "bench.h5"
    nbytes = make_file(path, gib)
    gb = nbytes / 2**30
    print(f"{gb:.2f} GiB of data; nodes of tests/cluster.py (veths to one bridge, TCP); best of {repeats}")
    print("| nodes | method | seconds | GiB/s | x floor |")
    print("|---|---|---|---|---|")
    for n in nodes:
        with Cluster(n, name="bench") as cluster:
            env = cluster.mpi_env({**os.environ, "PYTHONPATH": str(REPO)})
            argv = [sys.executable, "-m", "bench.datashare", "--rank-mode", "datashare", "--file", str(path),
                    "--chunk-mib", str(chunk_mib)]
            runs: dict[str, list[float]] = {"floor": [], "star": [], "datashare": []}
            for _ in range(repeats):  # the methods take turns, so that a busy moment of the machine hits each alike
                runs["floor"].append(tcp_copy(cluster, nbytes, cluster.hosts[1:2]))
                runs["star" if n > 2 else "floor"].append(tcp_copy(cluster, nbytes, cluster.hosts[1:]))
                proc = cluster.mpiexec(argv, ppn=1, env=env, timeout=300, cwd=REPO)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if proc.returncode or line is None:
                    raise SystemExit(f"datashare on {n} nodes failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
                runs["datashare"].append(json.loads(line[7:])["seconds"])
            rows = {key: min(times) for key, times in runs.items() if times}
        labels = {"floor": "TCP copy node0 -> node1 (floor)", "star": f"TCP copy node0 -> {n - 1} nodes at once",
                  "datashare": f"datashare, {n} nodes of 1 rank"}
        for key, seconds in rows.items():
            print(f"| {n} | {labels[key]} | {seconds:.3f} | {gb / seconds:.2f} | {seconds / rows['floor']:.2f} |",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--chunk-mib", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2, help="runs of each method; the fastest is reported")
    p.add_argument("--nodes-up-to", type=int, default=len(os.sched_getaffinity(0)),
                   help="run the one-rank-per-node variant up to this many ranks (default: the cores here; beyond "
                   "that, MPICH's shared-memory collectives stall for seconds when ranks outnumber cores)")
    p.add_argument("--evolve-memory", action="store_true", help="instead: memory of a real `galapagos evolve` job "
                   "on a --gib file and on one 1/32 its size, summed PSS of every process while the trainers run")
    p.add_argument("--workers", type=int, default=2, help="with --evolve-memory")
    p.add_argument("--evaluations", type=int, default=8, help="with --evolve-memory")
    p.add_argument("--cluster", type=int, nargs="+", metavar="NODES", help="instead: between nodes, on clusters of "
                   "this many namespace nodes (tests/cluster.py; root), against plain TCP copies over the same links")
    p.add_argument("--rank-mode", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--nbytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tcp-receive", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tcp-send", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_mode:
        return rank_main(args.rank_mode, args.file, args.chunk_mib)
    if args.tcp_receive:
        return tcp_receive(args.nbytes)
    if args.tcp_send:
        return tcp_send(args.nbytes, args.tcp_send)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        if args.cluster:
            return between_nodes(args.cluster, args.gib, args.chunk_mib, args.repeats, Path(tmp))
        if args.evolve_memory:
            return memory_table(args.gib, args.workers, args.evaluations, Path(tmp))
        path = Path(tmp) / "bench.h5"
        nbytes = make_file(path, args.gib)
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        base = floor(nbytes)
        gib = nbytes / 2**30
        print(f"{gib:.2f} GiB of data; copy floor (one numpy.copyto into fresh memory): {base['seconds']:.3f} s "
              f"({gib / base['seconds']:.2f} GiB/s)")
        print("| ranks | method | seconds | GiB/s | x floor | memory summed (PSS) | peak RSS summed |")
        print("|---|---|---|---|---|---|---|")
        for ranks in args.ranks:
            modes = ["naive", "datashare"] + (["datashare-nodes"] if ranks <= args.nodes_up_to else [])
            for mode in modes:
                r = min((run(ranks, mode, path, args.chunk_mib) for _ in range(args.repeats)),
                        key=lambda r: r["seconds"])
                label = {"naive": "each rank reads the file", "datashare": "datashare, one node",
                         "datashare-nodes": f"datashare, {ranks} nodes of 1 rank"}[mode]
                print(f"| {ranks} | {label} | {r['seconds']:.3f} | {gib / r['seconds']:.2f} | "
                      f"{r['seconds'] / base['seconds']:.2f} | {r['pss'] / 2**30:.2f} GiB | "
                      f"{r['peak_rss'] / 2**30:.2f} GiB |", flush=True)


if __name__ == "__main__":
    main()
