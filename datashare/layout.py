"""Arrays packed back to back in one flat byte buffer: the layout shared memory and its readers agree on.

Every array starts on an ``ALIGN``-byte boundary; :func:`layout` gives the offsets and :func:`views` the numpy views
(no copies) of a buffer laid out that way. ``MAX_COUNT`` is the most one MPI call with a C ``int`` count takes,
the bound every piece datashare sends stays under.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

__all__ = ["ArraySpec", "ALIGN", "MAX_COUNT", "array_spec", "layout", "specs_of", "views"]

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


def array_spec(item: Iterable[Any]) -> ArraySpec:
    """A (name, shape, dtype) triple as a checked ArraySpec: dtypes of plain bytes only, no negative dimensions."""
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
    for s in map(array_spec, specs):
        if s.name in offsets:
            raise ValueError(f"duplicate array name {s.name!r}")
        start = _align(end, align)
        offsets[s.name] = start
        end = start + s.nbytes
    return offsets, end


def specs_of(arrays: Mapping[str, np.ndarray]) -> list[ArraySpec]:
    """The specs of a dict of arrays, in its order."""
    return [array_spec((k, np.shape(a), np.asarray(a).dtype)) for k, a in arrays.items()]


def views(buffer: Any, specs: Iterable[Iterable[Any]]) -> dict[str, np.ndarray]:
    """Arrays laid out by :func:`layout` inside ``buffer``, as numpy views (no copies)."""
    specs = [array_spec(s) for s in specs]
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
