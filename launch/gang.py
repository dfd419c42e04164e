"""Gangs: one candidate trained data-parallel over the devices of several worker ranks, on other nodes too
(run.spread_ranks = m), where launch/spread.py spreads it over the devices of one rank.

The worker ranks 1..W make gangs of m neighbouring ranks (`gang_of`; the last one smaller where m does not divide
W). A gang's first rank is its leader: a worker of the master like any other, whose Spread group (launch/spread.py)
holds, beside its own trainer children, a `Remote` for each trainer child of the other ranks. Those, its
followers, tell the master they take no task (Ready with capacity 0) and serve their leader instead
(`follower_serve`): the member jobs of its tasks come over MPI on GANG_TAG, their children's Results go back the
same way. The Spread treats a Remote as one of its children: the same rendezvous, group ranks, pruning, failure
gathering and kills. The group meets at the leader's host over TCP (a TCPStore its first child serves), since a
FileStore needs a file every node sees.

A follower rank that stops answering its leader for the job's worker timeout fails the task it holds and leaves
the gang, which trains on without it (under ULFM, where the job goes on after a node's loss; elsewhere the job
ends and its script starts it again without the node: docs/faults.md). The followers of a leader that is lost
are told so by the master (Serve), and each takes tasks itself from then on, over its own devices.
"""
from __future__ import annotations

import logging
import socket
import time
from collections import defaultdict
from multiprocessing.connection import wait
from typing import Any

from galapagos.launch.heartbeat import MasterSilent, MasterWatch, Pulse
from galapagos.launch.mpi import Backoff
from galapagos.launch.protocol import TAG, Ready, Result, Serve, Status, Stop, Stopped, Task

log = logging.getLogger(__name__)

GANG_TAG = 19  # leader <-> followers (the runtime's is 17, the datashare layer's its own)


def gang_of(rank: int, workers: int, size: int) -> list[int]:
    """The worker ranks of `rank`'s gang, its leader first: ranks 1..`workers` in runs of `size` (1: itself)."""
    if not 1 <= rank <= workers or size < 1:
        raise ValueError(f"gang_of: rank {rank} is not a worker rank of 1..{workers}")
    first = 1 + (rank - 1) // size * size
    return list(range(first, min(first + size, workers + 1)))


def store_address(host: str) -> str:
    """Where a gang's group meets for one task: the leader's host and a port free there now (its first child
    serves the TCPStore on it)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


def meet(comm: Any, spread: Any, gang: list[int], timeout: float) -> None:
    """At the job's start, once the data is shared: each follower tells its leader its host and the devices of its
    children; the leader's Spread group (`spread`) takes them in as Remotes, each follower behind a Link that gives
    it up once silent for `timeout` seconds while it holds a task."""
    if comm.rank != gang[0]:
        comm.send(("hello", socket.gethostname(), spread.devices), dest=gang[0], tag=GANG_TAG)
        return
    remotes = []
    for rank in gang[1:]:
        _, host, devices = comm.recv(source=rank, tag=GANG_TAG)
        link = Link(comm, rank, host, timeout)
        remotes += [Remote(link, i, device) for i, device in enumerate(devices)]
    spread.join(remotes)
    log.info("worker rank %d leads a gang of ranks %s: each candidate trains on %d devices", comm.rank,
             ", ".join(map(str, gang)), len(spread.children))


class Link:
    """The leader's line to one follower rank, shared by that rank's Remotes: what it sent, sorted by child, and
    when it was last heard."""

    def __init__(self, comm: Any, rank: int, host: str, timeout: float) -> None:
        self.comm, self.rank, self.host, self.timeout = comm, rank, host, timeout
        self.inbox: dict[int, list[Result]] = defaultdict(list)
        self.heard = time.monotonic()
        self.gone = self.done = False  # lost; said its last word (the job is stopping)

    def send(self, msg: tuple) -> None:
        self.drain()  # what came while no task was out
        try:
            self.comm.send(msg, dest=self.rank, tag=GANG_TAG)
        except Exception as exc:  # noqa: BLE001 - as in drain
            log.warning("gang follower rank %d on %s: %s", self.rank, self.host, exc)
            self.gone = True

    def drain(self) -> None:
        try:
            while (msg := self.comm.improbe(source=self.rank, tag=GANG_TAG)) is not None:
                what, *rest = msg.recv()
                self.heard = time.monotonic()
                if what == "result":
                    index, result = rest
                    self.inbox[index].append(result)
                self.done = self.done or what == "bye"
        except Exception as exc:  # noqa: BLE001 - the rank is gone (ULFM): poll() fails its task
            log.warning("gang follower rank %d on %s: %s", self.rank, self.host, exc)
            self.gone = True

    def close(self) -> None:
        """At the job's stop: read what the follower still sends up to its last word, so that nothing is left
        unread here when MPI ends (with MPICH that can end this rank's MPI_Finalize early, and the launcher then
        kills the ranks still finishing)."""
        deadline = time.monotonic() + self.timeout
        while not (self.done or self.gone) and time.monotonic() < deadline:
            self.drain()
            time.sleep(0.01)

    def silent(self) -> float | None:
        """Seconds since the follower was last heard, if past the timeout (or it is gone)."""
        quiet = time.monotonic() - self.heard
        return quiet if self.gone or quiet > self.timeout else None


class Remote:
    """One trainer child of a follower rank, as the leader's Spread sees it: a Supervisor's face (submit, cancel,
    poll, end, current) over the Link."""

    conn = proc = None  # nothing local to wait on

    def __init__(self, link: Link, index: int, device: str) -> None:
        self.link, self.index, self.device = link, index, device
        self.rank, self.host = link.rank, link.host
        self.current: Task | None = None
        self.started = 0.0
        self.waiting = lambda: None

    @property
    def gone(self) -> bool:
        return self.link.gone

    def start(self) -> None:  # the follower starts, places and stops its own children
        pass

    place = attach = start

    def stop(self) -> None:
        self.link.close()

    def submit(self, task: Task) -> list:
        self.link.inbox.pop(self.index, None)
        self.current, self.started = task, time.time()
        self.link.send(("task", self.index, task))
        self.link.heard = time.monotonic()  # an idle follower says nothing: its silence counts from here
        return []

    def cancel(self, task_id: int, status: Status) -> list:
        if self.current is not None and self.current.id == task_id:
            self.link.send(("cancel", self.index, task_id, status))
        return []

    def end(self, status: Status, error: str) -> list:
        """The task ends now (its group failed): the follower kills the child; what it says of it is dropped."""
        if self.current is not None:
            self.link.send(("end", self.index, status, error))
            self.current = None
        return []

    def poll(self, timeout: float = 0.0) -> list:
        if self.current is None:
            return []
        self.link.drain()
        for result in self.link.inbox.pop(self.index, []):
            if result.id == self.current.id:
                self.current = None
                return [result]
        if (quiet := self.link.silent()) is not None:
            self.link.gone = True
            task, self.current = self.current, None
            error = (f"gang follower rank {self.rank} on {self.host} stopped answering ({quiet:.0f} s): it leaves the "
                     "gang")
            return [Result(task.id, self.rank, self.host, Status.CRASHED, None, self.started, time.time(), error=error)]
        return []


def follower_serve(comm: Any, children: list, leader: int, device: str, interval: float,
                   watch: MasterWatch | None = None) -> bool:
    """A follower rank's loop until the master's Stop: its trainer children run the member jobs its leader sends,
    their Results go back to it (progress stays here: the leader's first child speaks for the group), and Alive
    goes to the master, and to the leader while a task runs, when nothing else did for `interval` seconds. The
    master hears once that this rank takes no task (Ready, capacity 0); at its Stop the leader hears "bye". True
    where the master said Serve instead (the leader is lost): the jobs of the leader's task are ended, and the rank
    takes tasks itself from now on, with its own children."""
    pulse, backoff = Pulse(comm, interval), Backoff()
    told = time.monotonic()
    comm.send(Ready(comm.rank, socket.gethostname(), device, 0, leader), dest=0, tag=TAG)
    while True:
        msg = comm.improbe(source=0, tag=TAG)
        said = msg.recv() if msg is not None else None
        if isinstance(said, Stop):
            for child in children:
                child.stop()
            comm.send(("bye",), dest=leader, tag=GANG_TAG)  # its last word to the leader (Link.close)
            comm.send(Stopped(comm.rank), dest=0, tag=TAG)
            return False
        if isinstance(said, Serve):  # a job of the lost leader's would wait in a collective for it
            for child in children:
                child.end(Status.CANCELLED, f"gang leader rank {leader} lost")
            log.warning("worker rank %d: its gang's leader, rank %d, was lost; it takes tasks itself", comm.rank,
                        leader)
            return True
        events: list = []
        while (order := comm.improbe(source=leader, tag=GANG_TAG)) is not None:
            what, index, *args = order.recv()
            child = children[index]
            if what == "task":
                events += [(index, ev) for ev in child.submit(args[0])]
            elif what == "cancel":
                events += [(index, ev) for ev in child.cancel(*args)]
            elif what == "end":
                child.end(*args)  # the leader has the task's end already
        running = [c.conn for c in children if c.current is not None and c.conn is not None]
        if running and not events:
            wait(running, 0.01)
        for index, child in enumerate(children):
            events += [(index, ev) for ev in child.poll(0.0) if isinstance(ev, Result)]
        for index, result in events:
            comm.send(("result", index, result), dest=leader, tag=GANG_TAG)
        now = time.monotonic()
        if events or now - told >= interval:
            if not events and any(c.current is not None for c in children):  # the leader listens while it waits
                comm.send(("alive",), dest=leader, tag=GANG_TAG)
            told = now
        pulse.beat()
        if watch is not None and (silent := watch.check()) is not None:
            raise MasterSilent(watch.describe(silent))
        if msg is not None or events or running:
            backoff.reset()
        else:
            backoff.sleep()
