"""Read once, send between nodes, map everywhere: a dataset into one shared-memory copy per node.

Collective over the world communicator ``comm`` and ``node`` (the ranks of ``comm`` that share this node's memory):

1. Rank 0 describes what is sent (a :class:`datashare.plan.Plan`: HDF5 datasets, plus small arrays it holds in
   memory), and every rank says what it needs: everything, nothing, or row ranges of some arrays (a subset).
   A node needs the union of what its ranks need.
2. Node leaders (local rank 0) form their own communicator; each makes one shared segment for its node,
   checking first that the node has the room.
3. Arrays are cut into pieces of at most ``chunk_bytes``. Reader leaders (rank 0's by default, or every leader, or
   a count of them) read their pieces on a thread, straight into their node's segment, while the main thread
   sends earlier pieces: along a pipelined chain of the leaders (MPI's ``Bcast`` past ~500 nodes, see ``_chain``)
   when every other node needs a piece, to just the nodes that need it otherwise. A piece that travels carries
   its reader's checksums (``checksums``), verified on arrival on a thread while the next piece is received.
4. Leaders agree on errors; then the ranks of each node map the segment read-only and its name is removed, so the
   memory lives exactly as long as the processes that use it.

Nothing but the readers opens the file. Sizes and offsets are Python ints and every MPI count is one chunk
(below 2**31), so arrays of any size work with MPI libraries limited to ``int`` counts. This module never imports
mpi4py: callers pass communicators with mpi4py semantics.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import h5py
import numpy as np

from .checksums import CHECKSUM, CRC_BLOCK, checksum, pool as _crc_pool
from .format import check_values
from .layout import MAX_COUNT
from .plan import DataShareError, Plan, Source, array_parts
from .poll import Backoff
from .shm import SharedArrays
from .stream import node_rows as _node_rows, request as _request, resolve as _resolve, union as _union

log = logging.getLogger(__name__)

__all__ = ["DataShareError", "Shared", "share", "open_shared", "checksum"]

# The tag of datashare's point-to-point messages. They travel only on the node and leader communicators split off
# the world, whose own contexts keep them apart from the runtime's messages on the world (launch/protocol.py).
TAG = 23
DEPTH = 4  # pieces a reader may read ahead of the sending
CHAIN_BLOCK = 4 << 20  # bytes per message of the pipelined chain between node leaders


# -- requests and pieces ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    index: int
    source: int  # index into plan.sources
    rows: tuple[int, int]
    reader: int  # leader rank that reads it
    needers: tuple[int, ...]  # leader ranks whose node needs it


def _reader_ranks(readers: int | str, leaders: int) -> list[int]:
    if readers == "node":
        return list(range(leaders))
    k = max(1, min(int(readers), leaders))
    return sorted({i * leaders // k for i in range(k)})


def _pieces(plan: Plan, needs: list[dict[str, tuple[int, int]]]) -> list[Piece]:
    """Cut every array into pieces of at most chunk_bytes (and at every node's request edges), each with a reader."""
    readers = _reader_ranks(plan.readers, len(needs))
    out: list[Piece] = []
    for si, s in enumerate(plan.sources):
        n = s.shape[0] if s.shape else 1
        step = max(1, plan.chunk_bytes // max(1, s.row_bytes))
        cuts = set(range(0, n, step)) | {n}
        for need in needs:
            cuts.update(need.get(s.name, ()))
        cuts = sorted(cuts)
        for a, b in zip(cuts, cuts[1:]):
            needers = tuple(i for i, need in enumerate(needs)
                            if s.name in need and need[s.name][0] <= a and b <= need[s.name][1])
            if not needers:
                continue
            reader = 0 if s.dataset is None else readers[len(out) % len(readers)]
            out.append(Piece(len(out), si, (a, b), reader, needers))
    return out


# -- one node's segment ------------------------------------------------------------------------------------------
def _node_specs(plan: Plan, need: Mapping[str, tuple[int, int]]) -> list[tuple[str, tuple[int, ...], str]]:
    return [(s.name, ((need[s.name][1] - need[s.name][0]), *s.shape[1:]) if s.shape else (), s.dtype)
            for s in plan.sources if s.name in need]


def _piece_bytes(buffer: np.ndarray, offsets: Mapping[str, int], need: Mapping[str, tuple[int, int]],
                 s: Source, rows: tuple[int, int]) -> np.ndarray:
    start = offsets[s.name] + (rows[0] - need[s.name][0]) * s.row_bytes
    return buffer[start:start + (rows[1] - rows[0]) * s.row_bytes]


def _typed(raw: np.ndarray, s: Source, rows: tuple[int, int]) -> np.ndarray:
    shape = (rows[1] - rows[0], *s.shape[1:]) if s.shape else ()
    return raw.view(np.dtype(s.dtype)).reshape(shape)


class _Reader(threading.Thread):
    """Reads this leader's pieces in order, ahead of the sending, and checksums the ones that travel."""

    def __init__(self, plan: Plan, pieces: list[Piece], target, memory: Mapping[str, np.ndarray] | None):
        super().__init__(name="datashare-reader", daemon=True)
        self.plan, self.pieces, self.target, self.memory = plan, pieces, target, memory or {}
        self.out: queue.Queue = queue.Queue(maxsize=DEPTH)
        self.stop = threading.Event()

    def run(self) -> None:
        self.h5, self.fd = None, -1
        try:
            for p in self.pieces:
                if self.stop.is_set():
                    return
                s = self.plan.sources[p.source]
                raw, err, crc = self.target(p), None, ()
                try:
                    self._read(s, p, raw)
                    if any(i != p.reader for i in p.needers):  # it travels
                        crc = (CHECKSUM, checksum(raw, CHECKSUM))
                except Exception as exc:  # the error travels in the piece's header; no rank is left waiting
                    err = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
                self.out.put((p.index, raw, crc, err))
        finally:
            if self.h5 is not None:
                self.h5.close()
            if self.fd >= 0:
                os.close(self.fd)

    def close(self) -> None:
        """Stop reading, draining the queue so that a reader blocked on a full queue can see the stop."""
        self.stop.set()
        while self.is_alive():
            try:
                self.out.get(timeout=0.05)
            except queue.Empty:
                pass

    def _read(self, s: Source, p: Piece, raw: np.ndarray) -> None:
        a, b = p.rows
        dest = _typed(raw, s, p.rows)
        if s.dataset is None:
            src = np.asarray(self.memory[s.name])
            dest[...] = src[a:b] if s.shape else src
            return
        if s.offset is not None:  # the bytes as they are in the file, in parallel blocks (no HDF5 lock held)
            if self.fd < 0:
                self.fd = os.open(self.plan.path, os.O_RDONLY)
            start = s.offset + a * s.row_bytes
            blocks = range(0, raw.nbytes, CRC_BLOCK)
            got = _crc_pool().map(lambda i: os.preadv(self.fd, [raw[i:i + CRC_BLOCK]], start + i), blocks)
            if sum(got) != raw.nbytes:
                raise OSError(f"{self.plan.path}: {s.dataset}: short read of rows {a}:{b} (file truncated?)")
        elif b > a:
            if self.h5 is None:
                self.h5 = h5py.File(self.plan.path, "r")
            self.h5[s.dataset].read_direct(dest, source_sel=np.s_[a:b])
        info = self.plan.info
        if info is not None and b > a:  # values checked in parallel slices of the piece
            split, part = array_parts(s.name)
            step = -(-(b - a) // 4)
            list(_crc_pool().map(lambda i: check_values(info, split, dest[i:i + step] if part == "x" else None,
                                                        dest[i:i + step] if part == "y" else None, offset=a + i),
                                 range(0, b - a, step)))


def _subchunks(raw: np.ndarray, chunk: int) -> Iterable[np.ndarray]:
    for i in range(0, raw.nbytes, chunk):
        yield raw[i:i + chunk]


def _chain(leaders: Any, raw: np.ndarray, root: int, block: int) -> None:
    """Broadcast ``raw`` from ``root`` along the chain root, root+1, ... (mod size), pipelined by ``block``.

    Each leader receives block k while block k-1 goes on to the next leader, so each sends and receives every
    byte once: time ~ bytes/bandwidth + (leaders - 2) x block/bandwidth. MPI_Bcast of long messages in MPICH is a
    binomial tree below 8 ranks (the root sends everything log2(leaders) times) and scatter + allgather from 8
    (~2 x bytes/bandwidth): MPIR_CVAR_BCAST_MIN_PROCS in pmodels/mpich src/mpi/coll/bcast/bcast.c. So the chain
    is used while its fill, (leaders - 2) x block, is below the data: to ~500 nodes for 2 GiB in 4 MiB blocks.
    """
    me, n = leaders.Get_rank(), leaders.Get_size()
    pos = (me - root) % n
    sends = []
    for part in _subchunks(raw, block):
        if pos > 0:
            leaders.Recv(part, source=(me - 1) % n, tag=TAG)
        if pos < n - 1:
            sends.append(leaders.Isend(part, dest=(me + 1) % n, tag=TAG))
    for req in sends:
        req.Wait()


def _where(plan: Plan, p: Piece, leader_ranks: list[int]) -> str:
    s = plan.sources[p.source]
    return f"piece {p.index} ({s.name} rows {p.rows[0]}:{p.rows[1]}, read by rank {leader_ranks[p.reader]})"


def _move(leaders: Any, p: Piece, to: list[int], raw: np.ndarray, header: tuple | None, chunk: int, block: int,
          chain: bool) -> tuple:
    """Send piece ``p`` from its reader to the leaders ``to`` (whose nodes need it), or receive it there. Returns its
    header (the reader's checksums and error; after an error no bytes travel)."""
    me = leaders.Get_rank()
    if len(to) == leaders.Get_size() - 1:  # every other node: a pipelined chain, or MPI's own broadcast
        header = leaders.bcast(header if me == p.reader else None, root=p.reader)
        if header[1] is None and chain:
            _chain(leaders, raw, p.reader, block)
        elif header[1] is None:
            for part in _subchunks(raw, chunk):
                leaders.Bcast(part, root=p.reader)
    elif me == p.reader:
        for dest in to:
            leaders.send(header, dest=dest, tag=TAG)
            if header[1] is None:
                for part in _subchunks(raw, chunk):
                    leaders.Send(part, dest=dest, tag=TAG)
    else:
        header = leaders.recv(source=p.reader, tag=TAG)
        if header[1] is None:
            for part in _subchunks(raw, chunk):
                leaders.Recv(part, source=p.reader, tag=TAG)
    return header


def _verify(plan: Plan, checks: list[tuple], leader_ranks: list[int], me: int) -> list[str]:
    """Compare the checksums of the pieces this leader received (computed on the verifier thread) with their
    reader's; returns what did not match or could not be checked."""
    errors: list[str] = []
    host = socket.gethostname()
    for p, kind, want, got, raw in checks:
        where = _where(plan, p, leader_ranks)
        try:
            got = got.result()
        except DataShareError as exc:
            errors.append(f"{where} cannot be verified on rank {leader_ranks[me]} ({host}): {exc}")
            continue
        if tuple(got) != tuple(want):
            bad = [i for i, (w, g) in enumerate(zip(want, got)) if w != g]
            errors.append(f"{where} arrived corrupted on rank {leader_ranks[me]} ({host}): {kind} checksum "
                          f"mismatch in {len(bad)} of {len(want)} block(s), the first covering bytes "
                          f"{bad[0] * CRC_BLOCK}:{min(raw.nbytes, (bad[0] + 1) * CRC_BLOCK)} of the piece")
    return errors


def _transfer(plan: Plan, pieces: list[Piece], leaders: Any, segment: SharedArrays | None,
              need: Mapping[str, tuple[int, int]], memory, leader_ranks: list[int]) -> list[str]:
    """Move every piece to the leaders that need it (each read by its reader, moved, then verified on arrival);
    returns this leader's errors."""
    me, size = leaders.Get_rank(), leaders.Get_size()
    chunk = max(1, min(int(plan.chunk_bytes), MAX_COUNT))
    block = chunk if size == 2 else min(chunk, CHAIN_BLOCK)  # with one hop there is no fill to shorten
    chain = (size - 2) * block < plan.nbytes  # see _chain: while its fill costs less than the data
    offsets = segment.offsets if segment is not None else {}

    def target(p: Piece) -> np.ndarray:
        s = plan.sources[p.source]
        if me in p.needers:
            return _piece_bytes(segment.buffer, offsets, need, s, p.rows)
        return np.empty((p.rows[1] - p.rows[0]) * s.row_bytes if s.shape else s.row_bytes, np.uint8)

    mine = [p for p in pieces if p.reader == me]
    reader = _Reader(plan, mine, target, memory) if mine else None
    if reader is not None:
        reader.start()
    errors: list[str] = []
    checks: list[tuple[Piece, str, tuple[int, ...], Future, np.ndarray]] = []
    verifier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
    try:
        for p in pieces:
            to = [i for i in p.needers if i != p.reader]
            if me == p.reader:
                index, raw, crc, err = reader.out.get()
                assert index == p.index, (index, p.index)
                if err:
                    errors.append(f"{_where(plan, p, leader_ranks)}: {err}")
                header = (crc, err)
            elif me in to:
                raw, header = target(p), None
            else:
                continue
            if not to:
                continue
            header = _move(leaders, p, to, raw, header, chunk, block, chain)
            if me != p.reader and header[1] is None:
                kind, want = header[0]
                checks.append((p, kind, want, verifier.submit(checksum, raw, kind), raw))
        errors += _verify(plan, checks, leader_ranks, me)
    finally:
        verifier.shutdown(wait=True)
        if reader is not None:
            reader.close()
    return errors


# -- what every rank gets --------------------------------------------------------------------------------------
class Shared:
    """This rank's view of its node's shared copy: ``arrays`` (its request only), ``descriptor()`` for children."""

    def __init__(self, segment: SharedArrays | None, rows: Mapping[str, tuple[int, int]]):
        self.segment, self.rows = segment, dict(rows)
        self.arrays = _select(segment.arrays, self.rows) if segment is not None else {}

    def descriptor(self) -> dict | None:
        """What a child process started with ``pass_fds=[d['fd']]`` passes to :func:`open_shared`."""
        if self.segment is None:
            return None
        return {**self.segment.descriptor(), "rows": self.rows}

    @property
    def nbytes(self) -> int:
        return self.segment.nbytes if self.segment is not None else 0

    def close(self) -> None:
        self.arrays = {}
        if self.segment is not None:
            self.segment.close()

    def __enter__(self) -> "Shared":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _select(arrays: Mapping[str, np.ndarray], rows: Mapping[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    return {k: arrays[k][a:b] if arrays[k].ndim else arrays[k] for k, (a, b) in rows.items()}


def open_shared(descriptor: Mapping[str, Any]) -> tuple[SharedArrays, dict[str, np.ndarray]]:
    """In a child process: map the segment read-only and return it with the parent rank's arrays."""
    sa = SharedArrays.attach(descriptor)
    return sa, _select(sa.arrays, descriptor["rows"])


def _polite_recv(node: Any) -> Any:
    """Wait for the node leader with short sleeps: a blocking receive would spin on the core the reader needs."""
    backoff = Backoff(longest=0.01, shortest=1e-5, first=1e-5)
    while not node.iprobe(source=0, tag=TAG):
        backoff.sleep()
    return node.recv(source=0, tag=TAG)


def _agree(comm: Any, errors: list[str]) -> list[str]:
    return [e for errs in comm.allgather(errors) for e in errs]


def share(comm: Any, node: Any, plan: Plan | None = None, *, memory: Mapping[str, np.ndarray] | None = None,
          want: Mapping[str, Any] | None = None, prefix: str = "galapagos") -> Shared:
    """Deliver ``plan`` (given on rank 0, with ``memory`` for its in-memory arrays) to every rank; collective.

    ``want``: None for every array whole, ``{}`` for nothing (e.g. the master), or ``{name: (start, stop) | None
    | NODE}`` (NODE: this node's even share of the array's rows among the nodes whose ranks ask for it).
    Raises :class:`DataShareError` on every rank if any rank fails, with every reason.
    """
    t0 = time.perf_counter()
    rank = comm.Get_rank()
    if rank == 0:
        plan = plan if plan is not None else "rank 0 passed no plan"
    plan = comm.bcast(plan, root=0)
    if isinstance(plan, str):
        raise DataShareError(plan)
    is_leader = node.Get_rank() == 0
    leaders = comm.Split(0 if is_leader else 1, rank)
    try:
        try:
            request, req_error = _request(plan, want), None
        except DataShareError as exc:
            request, req_error = {}, f"rank {rank}: {exc}"
        requests = node.gather((request, req_error), root=0)
        segment, result = None, None
        if is_leader:
            errors = [e for _, e in requests if e]
            node_rows = _node_rows(plan, leaders, [r for r, _ in requests])
            need = _union(_resolve(r, node_rows) for r, _ in requests)
            try:
                if not errors:
                    segment = SharedArrays.create(_node_specs(plan, need), prefix=prefix)
            except OSError as exc:
                errors.append(f"rank {rank}: {exc}")
            errors = _agree(leaders, errors)
            if not errors:
                needs = leaders.allgather(need)
                leader_ranks = leaders.allgather(rank)
                pieces = _pieces(plan, needs)
                errors = _agree(leaders, _transfer(plan, pieces, leaders, segment, need, memory if rank == 0
                                                   else None, leader_ranks))
            if errors and segment is not None:
                segment.close()
                segment = None
            result = (segment.descriptor() if segment else None, errors, need, node_rows)
            for local in range(1, node.Get_size()):
                node.send(result, dest=local, tag=TAG)
        else:
            result = _polite_recv(node)
        descriptor, errors, need, node_rows = result
        request = _resolve(request, node_rows)
        if errors:
            more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
            raise DataShareError("data sharing failed: " + "; ".join(errors[:3]) + more)
        attach_error = None
        if not is_leader and request:
            try:
                segment = SharedArrays.attach(descriptor)
            except OSError as exc:
                attach_error = f"rank {rank}: {exc}"
        node.gather(None, root=0)  # every local rank has mapped it (or needs nothing): the name can go
        if is_leader and segment is not None:
            segment.unlink()
        if attach_error:
            raise DataShareError(attach_error)
        rows = {k: (a - need[k][0], b - need[k][0]) for k, (a, b) in request.items()}
        shared = Shared(segment, rows)  # a leader keeps its node's copy alive even when it needs none of it
        if rank == 0:
            dt = time.perf_counter() - t0
            log.info("shared %.1f MiB with %d rank(s) on %d node(s) in %.2f s (%.0f MiB/s)", plan.nbytes / 2**20,
                     comm.Get_size(), leaders.Get_size(), dt, plan.nbytes / 2**20 / max(dt, 1e-9))
        return shared
    finally:
        leaders.Free()

