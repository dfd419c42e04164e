"""A job that goes on when a node dies: its ranks run, and when they end on a lost node or rank, the nodes are
probed, those that do not answer are left out, and the ranks start again with ``--resume`` on the nodes that
remain, in the same allocation, without the user.

MPICH (the wheel's Hydra, Cray MPICH under srun or PALS) cannot go on without a rank: a killed rank or a dead node
ends every rank of the job (Hydra kills the others at once). A rank that stops answering is given up by rank 0: its
tasks go back to the queue, the other workers go on, and once the run is over rank 0 writes everything and ends the
job with EXIT_LOST (MPI would wait for the silent rank). Either way the run's journal on the shared file system
holds every evaluation it recorded, so a job that starts again with --resume loses only what was running: nothing
when rank 0 gave the node up itself, every running evaluation when MPICH ended the job at once (not journalled: the
resumed run breeds afresh), and at most the journal's write-behind (galapagos/store/rundir.py FLUSH_EVERY) of
results rank 0 had not written yet. Rank 0's node is not special: a restart puts rank 0 on the first node that
remains. Where the MPI goes on without a dead rank (Open MPI 5 with ULFM: launch/mpi.py failures_survivable) no
restart is needed: rank 0 gives the dead rank up at once and the job ends normally.

Two callers share `supervise`: a job script's one Galapagos command (`galapagos supervise`, run by every script
`galapagos launch` writes, with the scheduler's own way of starting ranks on a set of nodes and probing one node,
as launch/scripts/schedulers.py writes it), and `galapagos evolve --workers W` started from a shell, which restarts its
mpiexec on this one machine (`restart_locally`).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from galapagos.errors import UsageError
from galapagos.launch.protocol import EXIT_BAD_INPUT, EXIT_LOST, EXIT_NO_RESULT

log = logging.getLogger("galapagos")

MAX_RESTARTS = 3  # restarts a job gets by default: a node failure is rare, a fourth in a row is not a node failure
PROBE_TIMEOUT = 30.0  # seconds a node's one-task probe may take before the node counts as lost
PROBES_AT_ONCE = 64  # probes running at the same time (a whole machine's nodes are probed in rounds)
# Hours between failures of one node, when the site profile states none ([machine] node_mtbf_hours): five
# node-years. At 9,408 nodes that is a failure every 4.7 hours; 22 LANL systems of up to a few thousand nodes saw 20
# to 1,100 failures a year each (Schroeder and Gibson, "A large-scale study of failures in high-performance computing
# systems", DSN 2006, https://www.pdl.cmu.edu/PDL-FTP/associated/dsn06_abs.shtml; CTWatch Quarterly 3(4), 2007,
# https://icl.utk.edu/ctwatch/quarterly/articles/2007/11/failure-tolerance-in-petascale-computers/3/), so five
# node-years is on the pessimistic side for a whole-machine job. A site states its own.
NODE_MTBF_HOURS = 5 * 8760.0
# Seconds from a node's death to every surviving worker training again, as bench/recovery.py measures it
# (bench/RESULTS.md): the launcher's teardown, the probes, and a job's start (the data shared again, the children's
# imports); a restart costs the whole allocation this long.
RESTART_SECONDS = 60.0


@dataclass(frozen=True)
class Policy:
    """When to give up: after `max_restarts` restarts, or when fewer than `min_nodes` nodes answer."""

    max_restarts: int = MAX_RESTARTS
    min_nodes: int = 1
    probe_timeout: float = PROBE_TIMEOUT


@dataclass
class Outcome:
    """How a supervised job ended: the last attempt's exit code, the restarts it took, the nodes left out, and the
    one line that says why it gave up (None when it did not)."""

    code: int
    restarts: int = 0
    lost: list[str] | None = None
    gave_up: str | None = None


def restartable(code: int, stopped: bool) -> bool:
    """Whether an attempt that ended with `code` is worth another: not a run that ended (0) or that a new start
    cannot help (bad input: 2; nothing succeeded: 4), nor one the user or the scheduler stopped."""
    return not stopped and code not in (0, EXIT_BAD_INPUT, EXIT_NO_RESULT)


def answering(nodes: Sequence[str], probe: Callable[[str], list[str]], timeout: float = PROBE_TIMEOUT) -> list[str]:
    """The nodes whose probe (a one-task run of the launcher on that node) exits 0 within `timeout`, in order; up to
    PROBES_AT_ONCE run at a time. A probe past its time is killed with its process group."""
    alive: set[str] = set()
    for start in range(0, len(nodes), PROBES_AT_ONCE):
        batch = nodes[start:start + PROBES_AT_ONCE]
        procs = {}
        for node in batch:
            try:
                procs[node] = subprocess.Popen(probe(node), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                log.warning("cannot probe node %s: %s", node, exc)
        deadline = time.monotonic() + timeout
        while procs and time.monotonic() < deadline:
            for node, proc in list(procs.items()):
                if proc.poll() is not None:
                    if proc.returncode == 0:
                        alive.add(node)
                    del procs[node]
            time.sleep(0.05)
        for proc in procs.values():  # silent past the timeout: lost
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return [n for n in nodes if n in alive]


def supervise(attempt: Callable[[list[str], bool], tuple[int, bool]], nodes: list[str],
              probe: Callable[[str], list[str]] | None, policy: Policy, *, resume: bool = False,
              suspects: Callable[[float], list[str] | None] = lambda since: None) -> Outcome:
    """Run `attempt(nodes, resume)` -> (exit code, stopped by a signal) until it ends for good.

    After an attempt that may be worth another (restartable), the nodes are probed: those that `suspects(since)`
    names (the lost ranks' hosts rank 0 recorded during that attempt), or every node when it names none (rank 0
    died too); a node that answers keeps its place (its rank crashed, the node lives), one that does not is left
    out. Without `probe` (one machine) no node is left out. Gives up, with a line saying why, past
    `policy.max_restarts` restarts or below `policy.min_nodes` nodes."""
    outcome, lost = Outcome(0), []
    while True:
        began = time.time()
        code, stopped = attempt(nodes, resume)
        outcome.code = code
        if not restartable(code, stopped) or policy.max_restarts == 0:  # none allowed: the job's own end
            return outcome
        if outcome.restarts >= policy.max_restarts:
            outcome.gave_up = (f"the job ended with exit code {code} after {outcome.restarts} restart(s), the most "
                               f"it may take (--max-restarts {policy.max_restarts})")
            return outcome
        if probe is not None:
            asked = [n for n in (suspects(began) or nodes) if n in nodes]
            alive = answering(asked, probe, policy.probe_timeout)
            gone = [n for n in asked if n not in alive]
            nodes = [n for n in nodes if n not in gone]
            lost += gone
            outcome.lost = lost
            if gone:
                log.warning("node(s) %s did not answer a probe within %g s: left out", ", ".join(gone),
                            policy.probe_timeout)
            if len(nodes) < policy.min_nodes:
                outcome.gave_up = (f"the job ended with exit code {code} and {len(nodes)} node(s) answer, fewer "
                                   f"than --min-nodes {policy.min_nodes}" + (f" (lost: {', '.join(lost)})" if lost
                                                                              else ""))
                return outcome
        outcome.restarts += 1
        resume = True
        log.warning("the job ended with exit code %d: restart %d of %d with --resume on %d node(s)%s", code,
                    outcome.restarts, policy.max_restarts, len(nodes),
                    f", rank 0 on {nodes[0]}" if probe is not None and nodes else "")


# -- one machine: `galapagos evolve --workers W` started from a shell ---------------------------------------------
def resumed(opts: Any) -> Any:
    """The options of a job that continues `opts`'s run: --resume, with the run's own config (a --config or a
    --seed-from applied when the run began)."""
    changes = {k: v for k, v in (("resume", True), ("config", None), ("seed_from", None)) if hasattr(opts, k)}
    return replace(opts, **changes)


def restart_locally(name: str, opts: Any, workers: int, start: Callable[..., dict | None],
                    salvage: Callable[[Any, int], dict | None] | None, failed: type) -> dict | None:
    """`start(name, opts, workers, salvage=...)` (mpijob.start_ranks) again with --resume on this machine after
    the job lost a rank (a worker killed: MPICH ends every rank; or given up by rank 0: EXIT_LOST), up to
    opts.max_restarts times; the last attempt's result, or its JobFailed with exit code EXIT_LOST and the line
    that says why it gave up. `failed`: mpijob.JobFailed, what `start` raises when its job ends without a result."""
    restarts = getattr(opts, "max_restarts", MAX_RESTARTS)
    if restarts < 0:
        raise UsageError(f"--max-restarts {restarts}: must be 0 or more")
    policy = Policy(max_restarts=restarts if name in ("evolve", "ensemble", "design") else 0)  # those resume
    last: dict = {}

    def attempt(nodes: list[str], resume: bool) -> tuple[int, bool]:
        try:
            result = start(name, resumed(opts) if resume else opts, workers, salvage=salvage)
        except failed as exc:
            last["failed"], last["result"] = exc, None
            return exc.code, exc.code == 128 + signal.SIGINT or bool(getattr(exc, "stopped", False))
        last["failed"], last["result"] = None, result
        return (EXIT_LOST, False) if lost_ranks(result) and not _finished(result) else (0, False)

    outcome = supervise(attempt, ["localhost"], None, policy, resume=bool(getattr(opts, "resume", False)))
    if outcome.gave_up:
        error = last["failed"]
        raise failed(name, EXIT_LOST, error.summary if error else last["result"], reason=outcome.gave_up)
    if last["failed"] is not None:
        raise last["failed"]
    return last["result"]


def lost_ranks(result: dict | None) -> list[int]:
    """The worker ranks a job's result (an evolve, ensemble or design result) says were given up as silent."""
    result = result or {}
    return result.get("lost_ranks") or result.get("evolution", {}).get("lost_ranks") or []


def _finished(result: dict | None) -> bool:
    part = (result or {}).get("evolution", result) or {}
    return bool(part.get("finished"))


# -- what node failures cost ---------------------------------------------------------------------------------------
def expected_loss(nodes: int, walltime: float, mtbf_hours: float = NODE_MTBF_HOURS,
                  restart: float = RESTART_SECONDS) -> tuple[float, float]:
    """The expected share of an allocation (`nodes` for `walltime` seconds) that trains nothing because of node
    failures, (without recovery, with it), for failures at random (Poisson) at `nodes / mtbf` per hour.

    Without recovery the first failure ends the job: the share lost is 1 - E[min(first failure, T)] / T =
    1 - (1 - e^(-lT)) / (lT). With it each failure costs every node `restart` seconds, and the lost node is missing
    for the rest of the job (on average half of it): l * restart + T / (2 * mtbf), at most 1."""
    rate = nodes / (mtbf_hours * 3600.0)  # failures per second in the allocation
    x = rate * walltime
    without = 1.0 - (-math.expm1(-x)) / x if x > 0 else 0.0
    return without, min(1.0, rate * restart + walltime / (2 * mtbf_hours * 3600.0))
