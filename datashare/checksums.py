"""Checksums of the pieces that travel between nodes: per 16 MiB block, so a mismatch names where it is.

XXH3-64 hashes at about 16 GiB/s on one core, faster than a memcpy, where zlib's CRC-32 manages about 2 GiB/s
(measured on the 2-core VM, bench/RESULTS.md); both release the GIL, so a receiver verifies one piece on a thread
while the next arrives. The reader names the kind it used in each piece's header, so a rank without xxhash falls
back to CRC-32 when it reads and says so, rather than trusting a piece, when it cannot verify one.
"""
from __future__ import annotations

import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .plan import DataShareError

# https://pypi.org/project/xxhash/ : xxh3_64_intdigest(data) is the 64-bit XXH3 of any buffer, as an int
try:
    import xxhash
except ImportError:  # a clear fallback: correct, only slower
    xxhash = None

__all__ = ["CRC_BLOCK", "CHECKSUMS", "CHECKSUM", "checksum", "pool"]

CRC_BLOCK = 16 << 20  # bytes per checksum and per read: the blocks of one piece are read (and CRC'd) in parallel
CHECKSUMS = {"crc32": zlib.crc32}
if xxhash is not None:
    CHECKSUMS["xxh3-64"] = xxhash.xxh3_64_intdigest
CHECKSUM = "xxh3-64" if xxhash is not None else "crc32"  # what readers compute
_pool: ThreadPoolExecutor | None = None
_warned = False
log = logging.getLogger(__name__)


def pool() -> ThreadPoolExecutor:
    """Up to 4 threads for block reads, value checks and CRC-32s (all release the GIL)."""
    global _pool
    if _pool is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        _pool = ThreadPoolExecutor(max_workers=max(1, min(4, cores)), thread_name_prefix="datashare")
    return _pool


def checksum(buf: np.ndarray, kind: str = CHECKSUM) -> tuple[int, ...]:
    """The ``kind`` checksum of each 16 MiB block of a flat byte array."""
    if kind not in CHECKSUMS:
        raise DataShareError(f"checksum {kind!r} needs the xxhash package, which this rank lacks "
                             "(pip install xxhash)" if kind == "xxh3-64" else f"unknown checksum {kind!r}")
    global _warned
    if kind == "crc32" and xxhash is None and not _warned:
        _warned = True
        log.warning("the xxhash package is missing: checksumming pieces with CRC-32, about 8x slower (pip install "
                    "xxhash)")
    fn = CHECKSUMS[kind]
    blocks = [buf[i:i + CRC_BLOCK] for i in range(0, buf.nbytes, CRC_BLOCK)]
    if not blocks:
        return (fn(buf),)
    if len(blocks) == 1 or kind != "crc32":  # XXH3 outruns the memory: more threads would only contend
        return tuple(fn(b) for b in blocks)
    return tuple(pool().map(fn, blocks))
