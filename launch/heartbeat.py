"""Signs of life, both ways round, so that a hung node or a stopped rank is found in seconds, not at a task's limit.

- Worker ranks -> the master: any message counts. A worker rank that has sent nothing for `Liveness.interval`
  seconds sends :class:`protocol.Alive` (`Pulse`); the master keeps one timestamp per rank and, a few times per
  interval, gives up the ranks silent past `Liveness.worker_timeout` (`Silence`). The beat comes from the worker
  rank's own loop (its supervisor), not from the candidate it trains: a slow candidate is never the reason.
- Rank 0 -> whoever watches the job: nobody hears rank 0 but through MPI, and a stopped rank 0 says nothing, so
  it touches a file in the run directory's log/ from its serving loop (`Beacon`); any process on any node that
  sees the file's modification time stand still past `Liveness.master_timeout` (`MasterWatch`) ends the job: the
  command that started it, the recovery supervisor, and the first worker rank of each node.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from galapagos.launch.protocol import TAG, Alive, Liveness

log = logging.getLogger(__name__)


class MasterSilent(Exception):
    """Raised on a worker rank that found rank 0 silent past its timeout: the job must end (MPI_Abort)."""


class Pulse:
    """A worker rank's side: Alive to the master when the rank has sent it nothing for `interval` seconds; the
    rank's loop calls `sent` after anything it sends, so a rank that reports progress never sends Alive."""

    __slots__ = ("comm", "interval", "last")

    def __init__(self, comm: Any, interval: float) -> None:
        self.comm, self.interval, self.last = comm, interval, time.monotonic()

    def sent(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        if (now := time.monotonic()) - self.last >= self.interval:
            self.comm.send(Alive(self.comm.rank), dest=0, tag=TAG)
            self.last = now


class Silence:
    """The master's side: when each worker rank was last heard (`seen`, written by the loop for every message:
    one dict store, nothing else per message), and which ranks are silent past the timeout.

    The loop asks once a tick (`tick` seconds); the ranks are looked at every half interval at most, not per
    message: a scan of 100,000 timestamps takes a few milliseconds. A master that was itself away (its loop blocked
    on a slow file system, say) gives everyone an interval to be heard again first: their messages may still be on
    the way."""

    def __init__(self, ranks: range, liveness: Liveness, now: float, tick: float = 1.0) -> None:
        self.seen: dict[int, float] = dict.fromkeys(ranks, now)
        self.timeout, self.interval, self.tick = liveness.worker_timeout, liveness.interval, tick
        self.every = max(tick, liveness.interval / 2)
        self.asked = self.looked = self.back = now
        self.host = socket.gethostname()  # rank 0's own: never given up as a frozen node

    def silent(self, now: float, lost: set[int]) -> list[int]:
        """The ranks not lost yet and silent for longer than the timeout (none while the master is just back)."""
        if now - self.asked > self.tick + self.interval:
            self.back = now  # this loop was away: messages may still be on the way
        self.asked = now
        if now - self.looked < self.every or now - self.back < self.interval:
            return []
        self.looked = now
        cutoff = now - self.timeout
        return [rank for rank, seen in self.seen.items() if seen < cutoff and rank not in lost]

    def given_up(self, now: float, hosts: dict[int, str], lost: set[int]) -> list[tuple[list[int], str | None, str]]:
        """What to give up now, as (ranks, their node when it is given up whole, why). A node is given up whole
        when every worker rank on it has missed two beats at least: the node itself is frozen or cut off (not
        rank 0's own node, which is plainly alive). A rank whose host's other ranks still answer goes alone."""
        groups: list[tuple[list[int], str | None, str]] = []
        gone = set(lost)
        for rank in self.silent(now, lost):
            if rank in gone:
                continue
            why = f"silent for {now - self.seen[rank]:.0f} s; run.worker_timeout is {self.timeout:g} s"
            host = hosts.get(rank)
            alone = host is None or host == self.host
            peers = [] if alone else [r for r, h in hosts.items() if h == host and r not in gone]
            if peers and all(now - self.seen[p] > 2 * self.interval for p in peers):
                groups.append((peers, host, why))
                gone.update(peers)
            else:
                groups.append(([rank], None, why))
                gone.add(rank)
        return groups


class Beacon:
    """Rank 0's side: the heartbeat file, written when serving starts (who, and the timeout watchers apply),
    touched every interval, removed when serving ends (nothing to watch between phases and after)."""

    def __init__(self, liveness: Liveness) -> None:
        self.path = Path(liveness.master_file) if liveness.master_file else None
        self.interval, self.last, self.failed = liveness.interval, 0.0, False
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        info = {"pid": os.getpid(), "host": socket.gethostname(), "interval": liveness.interval,
                "timeout": liveness.master_timeout, "started": time.time()}
        try:
            tmp.write_text(json.dumps(info) + "\n")
            os.replace(tmp, self.path)  # a new file (a new inode): watchers read who writes it
        except OSError as exc:
            self.path = None
            log.warning("cannot write rank 0's heartbeat file %s (%s): nothing outside the job will notice if rank "
                        "0 stops", liveness.master_file, exc.strerror or exc)

    def beat(self, now: float) -> None:
        if self.path is None or now - self.last < self.interval:
            return
        self.last = now
        try:
            os.utime(self.path)
        except OSError as exc:
            if not self.failed:  # once: the watchers will end the job if it stays so
                log.warning("cannot touch rank 0's heartbeat file %s: %s", self.path, exc.strerror or exc)
            self.failed = True

    def close(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None


class MasterWatch:
    """Whether rank 0 still touches its heartbeat file, as seen from any process on any node.

    Clocks of different nodes may disagree, so the watch times the changes of the file's modification time by its
    own clock rather than comparing it with its own time. The file is opened each time it is looked at: an NFS
    client revalidates a file's attributes on open (close-to-open consistency, nfs(5): "DATA AND METADATA
    COHERENCE"), where a plain stat may answer from its attribute cache for up to a minute. A file that was there
    before the watch began (left by an earlier job that was killed) counts only once it changes."""

    def __init__(self, path: str | Path, timeout: float | None = None, every: float = 1.0) -> None:
        self.path, self.timeout, self.every = Path(path), timeout, every
        self.pid: int | None = None
        self.host: str | None = None
        self.file_timeout: float | None = None
        self.looked = 0.0
        self.changed: float | None = None  # when the file last changed, by this clock; None: not watched now
        self.stamp: tuple[int, int] | None = None
        self.stamp = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        """(inode, mtime in ns) of the file, reading who writes it when it is a new file; None while it is absent."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if self.stamp is None or self.stamp[0] != st.st_ino:
                self._read(fd)
            return st.st_ino, st.st_mtime_ns
        finally:
            os.close(fd)

    def _read(self, fd: int) -> None:
        try:
            info = json.loads(os.read(fd, 4096) or b"{}")
            self.pid, self.host, self.file_timeout = int(info["pid"]), str(info["host"]), float(info["timeout"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # caught mid-write: the next look reads it

    def check(self, now: float | None = None) -> float | None:
        """Seconds since rank 0 last touched the file, once that is past the timeout; else None (fresh, absent,
        or not changed since the watch began)."""
        now = time.monotonic() if now is None else now
        if now - self.looked < self.every:
            return self._late(now)
        self.looked = now
        stamp = self._stamp()
        if stamp is None:
            self.changed = None
        elif stamp != self.stamp:
            self.changed = now
        self.stamp = stamp
        return self._late(now)

    def _late(self, now: float) -> float | None:
        timeout = self.timeout or self.file_timeout
        if self.changed is None or timeout is None:
            return None
        silent = now - self.changed
        return silent if silent > timeout else None

    def describe(self, silent: float) -> str:
        """One line for the log: who is silent, since when, and what happens."""
        who = f"pid {self.pid} on {self.host}" if self.pid else "its process"
        return (f"rank 0 (the master, {who}) has not touched {self.path} for {silent:.0f} s (its timeout is "
                f"{self.timeout or self.file_timeout:g} s): it is stopped or hung, or its node is; ending the job")

    def wait_gone(self, seconds: float) -> None:
        """Wait up to `seconds` for rank 0's process to end, where it runs on this host: its end releases the run
        directory's lock (galapagos/store/runlock.py), which whoever writes the summary next must take."""
        if not self.pid or self.host != socket.gethostname():
            return
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # gone
            if state in ("Z", "X"):  # ended; its parent has yet to reap it
                return
            time.sleep(0.05)
