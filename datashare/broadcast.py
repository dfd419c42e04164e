"""Broadcast a dict of numpy arrays from one rank to all, as raw bytes in bounded chunks.

The dataset is read once (on the root) and sent with buffer-based ``Bcast`` calls, which move bytes without
pickling and can land straight in a caller-provided buffer (e.g. node shared memory). Chunks keep every MPI
count below 2**31 - 1, so arrays of any size work with MPI implementations limited to ``int`` counts.

This module never imports mpi4py: the caller passes a communicator (anything with ``Get_rank``, ``bcast`` and
``Bcast`` with mpi4py semantics), so ``import datashare`` works without MPI.
"""

from __future__ import annotations

import inspect as _inspect
import logging
import math
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["ArraySpec", "ALIGN", "MAX_COUNT", "layout", "specs_of", "views", "bcast_arrays"]

#: byte alignment of each array in a packed buffer (a cache line; enough for any numpy dtype and SIMD loads)
ALIGN = 64
#: the largest count one MPI call takes with a C ``int`` count
MAX_COUNT = 2**31 - 1


class ArraySpec(NamedTuple):
    """Name, shape and dtype of one array: what a receiver needs to allocate it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _spec(item: Iterable[Any]) -> ArraySpec:
    name, shape, dtype = item
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError(f"array {name!r}: dtype {dt} holds Python objects and cannot be sent as bytes")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"array {name!r}: negative dimension in shape {shape}")
    return ArraySpec(str(name), shape, dt)


def _align(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


def layout(specs: Iterable[Iterable[Any]], *, align: int = ALIGN) -> tuple[dict[str, int], int]:
    """Byte offsets of arrays packed back to back (each ``align``-aligned) in one buffer, and its total size.

    Sender, receiver and shared memory all call this, so they agree on where each array lives.
    """
    offsets: dict[str, int] = {}
    end = 0
    for s in map(_spec, specs):
        if s.name in offsets:
            raise ValueError(f"duplicate array name {s.name!r}")
        start = _align(end, align)
        offsets[s.name] = start
        end = start + s.nbytes
    return offsets, end


def specs_of(arrays: Mapping[str, np.ndarray]) -> list[ArraySpec]:
    """The specs of a dict of arrays, in its order."""
    return [_spec((k, np.shape(a), np.asarray(a).dtype)) for k, a in arrays.items()]


def _as_bytes(buffer: Any, total: int) -> np.ndarray:
    """A writable flat uint8 view of a caller's buffer (numpy array, memoryview, bytearray, mmap...)."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError("allocate() returned a non-contiguous array")
        buf = buffer.reshape(-1).view(np.uint8)
    else:
        buf = np.frombuffer(buffer, dtype=np.uint8)
    if not buf.flags.writeable:
        raise ValueError("allocate() returned a read-only buffer")
    if buf.nbytes < total:
        raise ValueError(f"allocate() returned {buf.nbytes} bytes, {total} needed")
    return buf


def views(buffer: Any, specs: Iterable[Iterable[Any]]) -> dict[str, np.ndarray]:
    """Arrays laid out by :func:`layout` inside ``buffer``, as numpy views (no copies)."""
    specs = [_spec(s) for s in specs]
    offsets, total = layout(specs)
    buf = buffer if isinstance(buffer, np.ndarray) and buffer.dtype == np.uint8 and buffer.ndim == 1 \
        else np.frombuffer(buffer, dtype=np.uint8)
    if buf.nbytes < total:
        raise ValueError(f"buffer has {buf.nbytes} bytes, {total} needed")
    out: dict[str, np.ndarray] = {}
    for s in specs:
        start = offsets[s.name]
        out[s.name] = buf[start:start + s.nbytes].view(s.dtype).reshape(s.shape)
    return out


def _call_allocate(allocate: Callable[..., Any], total: int, specs: list[ArraySpec]) -> Any:
    """Call ``allocate(total)`` or, if it takes two arguments, ``allocate(total, specs)``."""
    try:
        _inspect.signature(allocate).bind(total, specs)
    except TypeError:
        return allocate(total)
    except ValueError:  # no signature available (some builtins)
        return allocate(total)
    return allocate(total, specs)


def _byte_view(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def bcast_arrays(comm: Any, arrays: Mapping[str, np.ndarray] | None, *, root: int = 0,
                 chunk_bytes: int = 64 << 20, allocate: Callable[..., Any] | None = None) -> dict[str, np.ndarray]:
    """Send ``arrays`` (given on ``root``; ``None`` elsewhere) to every rank of ``comm``; collective.

    Names, shapes and dtypes go first (one small pickled ``bcast``), then each array's bytes in chunks of at
    most ``chunk_bytes`` (the root's value is used by all ranks). Receivers allocate plain numpy arrays, or,
    with ``allocate(total_nbytes)`` (or ``allocate(total_nbytes, specs)``) returning a writable buffer, place
    all arrays in that one buffer as laid out by :func:`layout`. Returns the dict of arrays; on the root, the
    given arrays (made contiguous where they were not). A bad input on the root raises on every rank.
    """
    rank = comm.Get_rank()
    meta: tuple[str, Any]
    if rank == root:
        try:
            if arrays is None:
                raise ValueError("bcast_arrays: the root rank must pass a dict of arrays, got None")
            src: dict[str, np.ndarray] = {}
            for k, a in arrays.items():
                a = np.asarray(a)
                src[str(k)] = a if a.flags.c_contiguous else a.copy(order="C")
            specs = specs_of(src)
            layout(specs)  # rejects duplicate names early, on every rank
            chunk = int(chunk_bytes)
            if chunk < 1:
                raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
            meta = ("ok", ([(s.name, s.shape, s.dtype.str) for s in specs], min(chunk, MAX_COUNT)))
        except Exception as e:  # tell the others instead of leaving them blocked in bcast
            meta = ("error", f"{type(e).__name__}: {e}")
            comm.bcast(meta, root=root)
            raise
    else:
        meta = ("", None)
    meta = comm.bcast(meta, root=root)
    status, payload = meta
    if status == "error":
        raise RuntimeError(f"bcast_arrays failed on root rank {root}: {payload}")
    raw_specs, chunk = payload
    specs = [_spec(s) for s in raw_specs]
    total_bytes = sum(s.nbytes for s in specs)

    if rank == root:
        out = src
    elif allocate is not None:
        _, total = layout(specs)
        out = views(_as_bytes(_call_allocate(allocate, total, specs), total), specs)
    else:
        out = {s.name: np.empty(s.shape, dtype=s.dtype) for s in specs}

    t0 = time.perf_counter()
    for s in specs:
        a = out[s.name]
        if a.nbytes == 0:
            continue
        raw = _byte_view(a)
        for start in range(0, raw.nbytes, chunk):
            comm.Bcast(raw[start:start + chunk], root=root)
    if rank == root and total_bytes:
        dt = time.perf_counter() - t0
        log.debug("broadcast %d arrays, %.1f MiB in %.3f s (%.0f MiB/s)", len(specs), total_bytes / 2**20, dt,
                  total_bytes / 2**20 / max(dt, 1e-9))
    return out
