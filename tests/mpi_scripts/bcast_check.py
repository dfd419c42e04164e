"""MPI check of datashare.broadcast: run as ``mpiexec -n N python -m mpi4py bcast_check.py [options]``.

Rank 0 broadcasts arrays of several dtypes and ranks; every rank regenerates them from the same seed and checks
bit-exact equality, for plain receive buffers, a caller's one-argument ``allocate`` and shared memory. Each
rank prints ``BCAST_OK rank=R`` (or ``ERROR_OK rank=R`` in ``--mode error``) when all is well.
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

from datashare.broadcast import ALIGN, bcast_arrays, layout, specs_of


def make_arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    special = rng.standard_normal(37).astype(np.float32)
    special[[3, 11, 20]] = [np.nan, np.inf, -np.inf]
    base = rng.standard_normal((40, 30))
    return {
        "f32_1d": rng.standard_normal(1001).astype(np.float32),  # 4004 bytes: 5 chunks of 1000, last one short
        "f16_3d": rng.standard_normal((3, 5, 7)).astype(np.float16),
        "u8_2d": rng.integers(0, 256, (33, 17), dtype=np.uint8),
        "i64_4d": rng.integers(-2**62, 2**62, (2, 3, 4, 5), dtype=np.int64),
        "f64_5d": rng.standard_normal((2, 2, 3, 3, 5)),
        "f32_special": special,
        "f64_scalar": np.array(rng.standard_normal()),
        "f32_empty": np.zeros((0, 4), np.float32),
        "f64_strided": base[:, ::3],  # not contiguous on the root
        "u8_big": rng.integers(0, 256, 300_007, dtype=np.uint8),
    }


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == \
        np.ascontiguousarray(b).tobytes()


def check(name: str, got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want), (name, list(got))
    for k in want:
        assert same(got[k], want[k]), f"{name}: array {k} differs on rank {MPI.COMM_WORLD.rank}"
        assert got[k].flags.c_contiguous, (name, k)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--chunk-bytes", type=int, default=64 << 20)
    parser.add_argument("--mode", choices=("all", "error"), default="all")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    want = make_arrays(args.seed)

    if args.mode == "error":
        # a bad input on the root must raise on every rank instead of leaving the others blocked
        bad = {"ok": np.zeros(3), "objects": np.array([object()], dtype=object)} if rank == 0 else None
        try:
            bcast_arrays(comm, bad, chunk_bytes=args.chunk_bytes)
        except (ValueError, RuntimeError) as e:
            assert "object" in str(e), str(e)
            print(f"ERROR_OK rank={rank}", flush=True)
        return

    # 1. plain numpy receive buffers
    got = bcast_arrays(comm, want if rank == 0 else None, chunk_bytes=args.chunk_bytes)
    check("plain", got, want)
    if rank == 0:
        assert got["u8_big"] is want["u8_big"]  # the root gets its own arrays back

    # 2. a one-argument allocate returning a bytearray: one buffer, 64-byte aligned layout
    holder: list[bytearray] = []

    def allocate(total: int) -> bytearray:
        holder.append(bytearray(total))
        return holder[-1]

    got = bcast_arrays(comm, want if rank == 0 else None, chunk_bytes=args.chunk_bytes, allocate=allocate)
    check("allocate", got, want)
    if rank != 0:
        offsets, total = layout(specs_of(want))
        assert len(holder) == 1 and len(holder[0]) == total, (len(holder), total)
        base = np.frombuffer(holder[0], np.uint8)
        for k, a in got.items():
            assert np.shares_memory(a, base) or a.size == 0, k
            if a.size:
                assert a.ctypes.data - base.ctypes.data == offsets[k] and offsets[k] % ALIGN == 0, k

    comm.Barrier()
    print(f"BCAST_OK rank={rank}", flush=True)


if __name__ == "__main__":
    main()
