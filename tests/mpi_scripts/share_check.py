"""Run under mpiexec: datashare.share delivers the same bytes to every rank, one copy per node.

    python -m mpi4py tests/mpi_scripts/share_check.py CASE [--file F.h5] [--prefix P]

GALAPAGOS_RANKS_PER_NODE splits the machine into several "nodes", so the between-node paths run on one host.
Each case prints `CASE_OK rank=R` on success, or `SHARE_ERROR rank=R: message` where an error is expected.
"""
from __future__ import annotations

import argparse
import os
import signal
import zlib

import numpy as np

from galapagos.datashare import checksums
from galapagos.datashare import share as ds
from galapagos.datashare.plan import Plan, Source, array_name, dataset_plan, split_arrays
from galapagos.datashare.share import DataShareError, open_shared, share
from galapagos.launch.mpi import node_comm, world

DTYPES = ("float32", "float16", "float64", "uint8", "int8", "int32", "int64", "bool", "complex64")


def arrays() -> dict[str, np.ndarray]:
    """Every dtype and 0 to 4 dimensions; sizes that are not multiples of the chunk."""
    rng = np.random.default_rng(11)
    out = {"scalar": np.float64(2.5), "empty": np.zeros((0, 3), np.float32)}
    for i, dt in enumerate(DTYPES):
        shape = [(1001,), (37, 3), (13, 2, 5), (7, 3, 4, 5), (5, 2, 3, 3, 2)][i % 5]
        out[f"a{i}_{dt}"] = (rng.standard_normal(shape) * 50).astype(dt)
    return out


def case_exact(comm, node, readers) -> None:
    src = arrays()
    plan = Plan.of_arrays(src, chunk_bytes=1000, readers=readers)
    with share(comm, node, plan, memory=src if comm.rank == 0 else None) as got:
        assert sorted(got.arrays) == sorted(src)
        for k, a in src.items():
            b = got.arrays[k]
            assert b.dtype == a.dtype and b.shape == np.shape(a), (k, b.dtype, b.shape)
            assert np.asarray(b).tobytes() == np.asarray(a).tobytes(), k
            assert not b.flags.writeable or node.rank == 0, k  # mapped read-only except by the node's leader
        # one copy per node: every rank of a node maps the same file
        inodes = node.allgather(got.descriptor()["inode"])
        assert len({tuple(i) for i in inodes}) == 1, inodes
        leaders = comm.allgather((node.rank == 0, tuple(inodes[0])))
        assert len({i for lead, i in leaders if lead}) == sum(lead for lead, _ in leaders)
        # a child process maps it through the inherited descriptor, after the name is gone
        d = got.descriptor()
        assert not os.path.exists(f"/dev/shm/{d['name']}"), "the name must be gone once every rank mapped it"
        seg, child_view = open_shared(d)
        assert all(np.asarray(child_view[k]).tobytes() == np.asarray(src[k]).tobytes() for k in src)
        seg.close()


def case_file(comm, node, path: str) -> None:
    plan, memory, info = dataset_plan(path, ("train", "val", "test"), val_fraction=0.25, seed=3, chunk_bytes=4096,
                                      readers="node")
    want = None if comm.rank else {}
    with share(comm, node, plan if comm.rank == 0 else None, memory=memory, want=want) as got:
        if comm.rank:
            from galapagos.datashare.format import load

            _, ref = load(path, ("train", "test"))
            for split, (x, y) in ref.items():
                assert np.array_equal(got.arrays[array_name(split, "x")], x)
                assert np.array_equal(got.arrays[array_name(split, "y")], y)
            _, carved = load(path, ("train", "val"), val_fraction=0.25, seed=3)
            for split, part in split_arrays(got.arrays, ("train", "val")).items():
                x, y = carved[split]
                assert part.index is not None, split
                assert np.array_equal(part.x[part.index], x) and np.array_equal(part.y[part.index], y), split
        else:
            assert got.arrays == {}


def case_subset(comm, node) -> None:
    """Rank r asks for rows [10 r, 10 r + 25) of 'x' and none of 'z': nodes get just the union of their ranks'."""
    src = {"x": np.arange(200 * 6, dtype=np.float32).reshape(200, 6), "z": np.ones((300, 4))}
    want = {"x": (10 * comm.rank, 10 * comm.rank + 25)}
    plan = Plan.of_arrays(src, chunk_bytes=64)
    with share(comm, node, plan, memory=src if comm.rank == 0 else None, want=want) as got:
        assert sorted(got.arrays) == ["x"]
        assert np.array_equal(got.arrays["x"], src["x"][10 * comm.rank:10 * comm.rank + 25])
        lo, hi = min(node.allgather(10 * comm.rank)), max(node.allgather(10 * comm.rank + 25))
        assert got.nbytes == (hi - lo) * 6 * 4, (got.nbytes, lo, hi)  # the node holds its union, nothing else


def case_corrupt(comm, node, kind: str) -> None:
    """Rank 2 flips a bit of every piece it receives before verifying it: as if the network had.

    ``kind``: the checksum the reader uses (``crc32`` is the fallback without xxhash); ``missing`` makes rank 2 a
    rank without xxhash, which must say so rather than trust the piece.
    """
    if kind == "missing":
        if comm.rank == 2:
            del checksums.CHECKSUMS["xxh3-64"]
    else:
        ds.CHECKSUM = kind
    if comm.rank == 2 and kind != "missing":
        original = ds.checksum

        def corrupting(buf, *kind):
            buf[len(buf) // 2] ^= 0x10
            return original(buf, *kind)

        ds.checksum = corrupting
    src = {"x": np.arange(5000, dtype=np.int64)}
    share(comm, node, Plan.of_arrays(src, chunk_bytes=8192), memory=src if comm.rank == 0 else None)


def case_nan(comm, node, path: str) -> None:
    plan, memory, _ = dataset_plan(path, ("train", "val"), chunk_bytes=512)
    share(comm, node, plan if comm.rank == 0 else None, memory=memory, want={} if comm.rank == 0 else None)


def case_crash(comm, node, prefix: str, when: str) -> None:
    """One rank is killed (SIGKILL, no cleanup possible) after the data arrived, or while it arrives."""
    src = {"x": np.arange(1 << 20, dtype=np.float32)}
    victim = comm.size - 1
    if when == "during":
        victim = 2  # the leader of the second node dies receiving its first piece

        def dying(buf, *kind):
            os.kill(os.getpid(), signal.SIGKILL)

        if comm.rank == victim:
            ds.checksum = dying
    got = share(comm, node, Plan.of_arrays(src, chunk_bytes=1 << 16), memory=src if comm.rank == 0 else None,
                prefix=prefix)
    comm.Barrier()
    if comm.rank == victim:
        print(f"CRASHING rank={comm.rank}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Barrier()  # never completes: the launcher ends the job
    got.close()


def case_large(comm, node, path: str) -> None:
    """An array over 4 GiB: counts stay below 2**31 per call, offsets are 64-bit."""
    import h5py

    with h5py.File(path, "r") as f:
        n, row = f["big"].shape
    plan = Plan(path, (Source("big", (n, row), "|u1", "/big"),), chunk_bytes=256 << 20)
    with share(comm, node, plan if comm.rank == 0 else None) as got:
        a = got.arrays["big"]
        assert a.nbytes > 2**32, a.nbytes
        crc = zlib.crc32(a.reshape(-1))
        assert a[-1, -1] == (n * row - 1) % 251, a[-1, -1]
        crcs = comm.allgather(crc)
        assert len(set(crcs)) == 1, crcs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("case")
    p.add_argument("--file")
    p.add_argument("--prefix", default="galapagos")
    p.add_argument("--readers", default="1")
    p.add_argument("--when", default="after")
    p.add_argument("--checksum", default="xxh3-64")
    args = p.parse_args()
    comm = world()
    node = node_comm(comm)
    readers = args.readers if args.readers == "node" else int(args.readers)
    try:
        if args.case == "exact":
            case_exact(comm, node, readers)
        elif args.case == "file":
            case_file(comm, node, args.file)
        elif args.case == "subset":
            case_subset(comm, node)
        elif args.case == "corrupt":
            case_corrupt(comm, node, args.checksum)
        elif args.case == "nan":
            case_nan(comm, node, args.file)
        elif args.case == "crash":
            case_crash(comm, node, args.prefix, args.when)
        elif args.case == "large":
            case_large(comm, node, args.file)
    except DataShareError as exc:
        print(f"SHARE_ERROR rank={comm.rank}: {exc}", flush=True)
        return
    comm.Barrier()
    print(f"CASE_OK rank={comm.rank}", flush=True)


if __name__ == "__main__":
    main()
