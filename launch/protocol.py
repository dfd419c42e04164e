"""Everything the ranks and processes of a job say to each other: small, explicit, never model weights.

Two wires, one vocabulary:

- MPI, master <-> worker ranks, on :data:`TAG`: the master sends :class:`Setup` (or :class:`SetupFailed`) once,
  then :class:`Task`, :class:`Cancel` and :class:`Stop` (and :class:`Serve` to a gang's follower); a worker sends
  :class:`Ready` once, then :class:`Progress` and :class:`Result` (and :class:`Alive` when it has said nothing for
  a while), and :class:`Stopped` last, in answer to Stop (or :class:`RankFailed`, if it fails unexpectedly while
  serving). A gang's leader and followers speak on launch/gang.py's GANG_TAG.
- The pipe between a worker rank's supervisor and its trainer child: the supervisor sends :class:`TrainerDevice`
  (a child on a GPU, before its setup), :class:`TrainerSetup` once, then :class:`Task`, :class:`Cancel` and
  :class:`Stop`; the child answers :class:`TrainerReady` (or :class:`TrainerFailed`) once, then :class:`Progress`
  and :class:`Outcome`, which the supervisor turns into a :class:`Result` with the rank, host and times.

Every message is a frozen dataclass from this module; statuses are :class:`Status` values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

TAG = 17  # the runtime's MPI tag (the datashare layer has its own for the data it sends)
EXIT_BAD_INPUT = 2  # every rank's exit code, and the command's, when the job cannot start on bad input
# The job's exit code when worker ranks stopped answering: rank 0 writes everything, then MPI_Abort(EXIT_LOST) ends
# every rank (a stopped one would never exit); MPICH's mpiexec exits with this code.
EXIT_LOST = 3
EXIT_CRASH = 1  # the job's exit code when a rank failed unexpectedly and ended the job (MPI_Abort)
EXIT_NO_RESULT = 4  # the exit code of `galapagos evolve` (and `design`) when the run ended and nothing succeeded


class Status(str, Enum):
    """How a task ended. Only `ok` and `pruned` carry a fitness; the others count as the worst."""

    OK = "ok"
    PRUNED = "pruned"  # stopped early by the master as hopeless; its best fitness so far is kept
    FAILED = "failed"  # the task raised
    NAN = "nan"  # the loss or the validation score became NaN or infinite
    OOM = "oom"  # out of memory
    CRASHED = "crashed"  # the trainer child died (segfault, abort, killed)
    TIMEOUT = "timeout"  # past its time limit
    CANCELLED = "cancelled"  # the run is ending; not an evaluation
    LOST = "lost"  # the worker rank stopped answering; its tasks are given up
    # The disk refused the task's files (no room, a quota, read-only): not the candidate's fault. The master
    # records nothing for it and stops the run (exit 2); --resume trains the evaluation again.
    DISK = "disk"

    def __str__(self) -> str:  # "ok" in f-strings and logs, as in the journal
        return self.value


# -- master -> worker ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Liveness:
    """How the ranks of a job show they are alive (launch/heartbeat.py): a worker rank that has sent nothing else
    for `interval` seconds sends Alive, and is given up once silent for `worker_timeout`; rank 0 touches
    `master_file` every `interval` seconds while it serves, and the job is ended once it has not for
    `master_timeout` (the [run] table's heartbeat, worker_timeout and master_timeout)."""

    interval: float = 10.0
    worker_timeout: float = 30.0
    master_timeout: float = 60.0
    master_file: str | None = None  # None: rank 0 leaves no file, and nothing outside the job watches it


@dataclass(frozen=True)
class Setup:
    """Sent once to every worker: what to run for each task and where trainers log."""

    task_fn: str  # 'module:function' run in the trainer child for each task
    log_dir: str | None = None
    chunk_bytes: int = 64 << 20  # for data given as in-memory arrays; a Plan carries its own
    want: dict | None = None  # what each worker asks of the shared arrays (datashare.share.share); None: all
    liveness: Liveness = field(default_factory=Liveness)
    pack: int | str = 1  # candidates each worker rank trains at once on its device, or "auto" (run.pack)
    spread: int | str = 1  # devices each candidate trains on at once, or "auto" (run.spread)
    spread_ranks: int = 1  # worker ranks each candidate trains on at once, a gang (run.spread_ranks)


@dataclass(frozen=True)
class SetupFailed:
    """Sent instead of Setup when the master cannot start the job: the workers exit with the bad-input code."""

    reason: str


@dataclass(frozen=True)
class Task:
    """One task for a worker rank. A payload with an `echo` (a dict, or None) has its worker add that to the
    metrics of the task's Result: what the worker decided that rank 0 must hear (a drawn genome:
    evolve/drawn.py). The worker reads it from the payload as it arrived."""

    id: int
    payload: Any
    time_limit: float | None = None


@dataclass(frozen=True)
class Cancel:
    id: int
    status: Status = Status.CANCELLED


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Serve:
    """To a gang's follower whose leader was lost (launch/gang.py): it takes tasks itself from now on."""


# -- worker -> master ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    """A worker rank is ready for `capacity` tasks at once (run.pack). Sent again when the capacity changes (an
    "auto" pack, once its first candidate's memory is measured): the master keeps the tasks it holds."""

    rank: int
    host: str
    device: str
    capacity: int = 1
    leader: int | None = None  # capacity 0: a gang's follower, which serves this rank's tasks (launch/gang.py)


@dataclass(frozen=True)
class Progress:
    id: int
    rank: int
    metrics: dict


@dataclass(frozen=True)
class Alive:
    """A worker rank's sign of life when it has sent nothing else for Liveness.interval seconds (any message
    counts): the master only notes when it heard the rank."""

    rank: int


@dataclass(frozen=True)
class Stopped:
    """A worker's last message, in answer to Stop. The master reads up to it: with MPICH, messages left unread on
    rank 0 can make its MPI_Finalize return early, without telling the launcher, which then kills the workers that
    have not finished yet (a clean stop would end with exit code 9)."""

    rank: int


@dataclass(frozen=True)
class RankFailed:
    """A worker rank's last message when it fails unexpectedly while serving (a bug, or its node refusing it a
    process or memory): the master gives up the tasks it held and sends it nothing more, and the job ends as one
    with a rank that stopped answering (EXIT_LOST), since this rank cannot leave MPI before the others."""

    rank: int
    error: str  # "Type: message"


@dataclass(frozen=True)
class Result:
    id: int
    rank: int
    host: str
    status: Status
    fitness: float | None
    started: float
    ended: float
    metrics: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started


# -- supervisor <-> trainer child ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainerDevice:
    """The device of a child started before its rank was placed, sent once it is, ahead of the setup (which waits
    for the data to be shared): the child starts the device's runtime meanwhile."""
    device: str


@dataclass(frozen=True)
class TrainerSetup:
    rank: int
    task_fn: str
    data: dict | None  # the shared data's descriptor (datashare.share.Shared.descriptor)
    cores: tuple[int, ...] | None
    device: str
    threads: int
    log: str | None = None  # where the child writes its output from now on (one started early had none)


@dataclass(frozen=True)
class TrainerReady:
    pid: int


@dataclass(frozen=True)
class TrainerFailed:
    reason: str


@dataclass(frozen=True)
class Outcome:
    """How one task ended in the trainer child (the supervisor adds rank, host and times)."""

    id: int
    status: Status
    fitness: float | None = None
    metrics: dict = field(default_factory=dict)
    error: str | None = None
