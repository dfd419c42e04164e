"""How a job (evolve, ensemble, design, predict over ranks) runs, whoever starts it.

Under a launcher (mpiexec, srun, jsrun, aprun, flux run) the ranks are there: rank 0 runs the flow's master and
every other rank serves as a worker. Started as one process (a laptop, a notebook, the CLI without mpiexec), the
job checks its inputs here, then starts itself under `mpiexec -n W+1` as ``python -m galapagos.flows.ranks``; rank 0 of
that job writes its result (or its one-line error) to a file that this process reads back.
"""
from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from galapagos.errors import NoResult, UsageError
from galapagos.launch.protocol import EXIT_BAD_INPUT, EXIT_CRASH, EXIT_LOST

log = logging.getLogger("galapagos")


class JobFailed(RuntimeError):
    """The started job ended without a result; its ranks' output says why. `summary` is what the flow's salvage
    made of the run's files (None when it has none)."""

    def __init__(self, name: str, code: int, summary: dict | None = None, *, reason: str | None = None,
                 stopped: bool = False):
        super().__init__(f"galapagos {name}: the job ended with exit code {code} (see its output above)")
        self.code, self.summary = code, summary
        self.reason = reason  # why the job was given up (galapagos/flows/recovery.py), for the user's one line
        self.stopped = stopped  # a stop signal ended it: not restarted


class WorkerExit(Exception):
    """A worker rank ends with this exit code (the master could not start the job; rank 0 says why)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Flow:
    """One application flow: what is checked before any rank starts, and what rank 0 does under MPI."""

    name: str
    check: Callable[[Any], Any]  # options -> anything; raises on bad input, writes nothing
    master: Callable[[Any, Any], dict | None]  # (comm, options) -> the result, on rank 0
    # (options, exit code) -> a summary written from the run's files, when the job died without rank 0's result
    salvage: Callable[[Any, int], dict | None] | None = None
    # a collective flow, started as one process: options -> (the options to run with, the ranks it needs)
    plan: Callable[[Any], tuple[Any, int]] | None = None
    # started without MPI: the checked job run in this process when it needs no worker (an ensemble of kept
    # networks), so that no ranks start; None when it needs them
    alone: Callable[[Any], dict | None] | None = None


@dataclass(frozen=True)
class FlowRef:
    """A flow by the module that holds it (as FLOW), and what a worker rank needs of it: a worker rank never imports
    the flow (the engine, the journal, the checks); it only relays tasks to its trainer child, the one process of a
    worker that imports torch and the task function (bench/first_task.py)."""

    module: str
    phases: int = 1  # jobs each worker rank serves in turn (design: evolution, then ensemble)
    # every rank runs the flow's `master` with the job's comm, as one collective (predict); no worker serves tasks
    collective: bool = False
    task: str | None = None  # the task function its trainer children most likely run, imported before the setup

    def load(self) -> Flow:
        return importlib.import_module(self.module).FLOW


class RunLogHandler(logging.FileHandler):
    """The run's log file (OUT/log/master.log). A write that fails (a full disk, a file system gone read-only) stops
    the file, not the run: the error that matters reaches the user from the run itself, in one line, not in a
    logging traceback."""

    def handleError(self, record: logging.LogRecord) -> None:
        self.emit = lambda record: None  # type: ignore[method-assign]


def setup_logging(rank: int = 0, logfile: Path | None = None) -> None:
    """Rank 0 logs at INFO, workers at WARNING, each line with its rank."""
    fmt = f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile is not None:
        handlers.append(RunLogHandler(logfile))
    for h in handlers:
        h.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, handlers=handlers, force=True)


def default_workers() -> int:
    """One worker per GPU, else one per physical core (a share of a node for each)."""
    from galapagos.launch.placement import allowed_cores, core_count, gpu_count

    return gpu_count() or core_count(allowed_cores())


def run(ref: FlowRef, opts: Any) -> dict | None:
    """The flow's result on rank 0 (or in the process that started the job); None on the other ranks."""
    from galapagos.launch.mpi import under_launcher

    if not under_launcher():
        flow = ref.load()
        if ref.collective:  # as many ranks as it needs; one runs here, without MPI
            opts, ranks = flow.plan(opts)
            return start_ranks(flow.name, opts, ranks - 1) if ranks > 1 else flow.master(None, opts)
        job = flow.check(opts)
        if flow.alone is not None and (result := flow.alone(job)) is not None:
            return result
        from galapagos.flows.recovery import restart_locally

        return restart_locally(flow.name, opts, default_workers() if opts.workers is None else opts.workers,
                               start_ranks, flow.salvage, JobFailed)
    return run_rank(ref, opts)


def run_rank(ref: FlowRef, opts: Any) -> dict | None:
    """This rank's part of a job started by a launcher."""
    from galapagos.launch.mpi import world
    from galapagos.launch.signals import announce_ready, catch_stop_signals
    from galapagos.launch.session import worker_main
    from galapagos.launch.supervisor import uncompiled

    catch_stop_signals()
    comm = _world(world)
    check_wired(comm)
    if comm.rank != 0 and not ref.collective:
        worker_stop_signals()
    if comm.rank == 0:
        from galapagos.launch.doctor import job_report

        job_report(log)  # the doctor's findings for this rank's MPI, network and node: once, no MPI traffic
    announce_ready(comm)
    if ref.collective:
        return ref.load().master(comm, opts)
    if comm.size < 2:
        raise UsageError(f"galapagos {ref.load().name} needs at least one worker: run it under mpiexec/srun with 2 or "
                         "more ranks (rank 0 is the master), or start it without MPI and pass --workers W")
    if comm.rank == 0:
        flow = ref.load()
        workers = getattr(opts, "workers", None)
        if workers and workers != comm.size - 1:
            log.warning("--workers %d ignored: this job has %d worker rank(s)", workers, comm.size - 1)
        if ref.task and (why := uncompiled()):
            log.warning(why)
        try:
            return flow.master(comm, opts)
        except (*user_errors(), NoResult):
            raise  # bad input, or a run with nothing to show: the workers were told, or stopped
        except (Exception, KeyboardInterrupt) as exc:
            abort(comm, flow.name, exc, getattr(opts, "out", None))
    setup_logging(comm.rank)
    try:
        for phase in range(ref.phases):
            if (code := worker_main(comm, ref.task)) != 0:  # the master could not start this phase; it says why
                if phase == 0:
                    raise WorkerExit(code)
                break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)  # served to the end: a stop signal's deadline is void
    return None


# Seconds a worker rank that received SIGTERM waits for the master's Stop before it leaves on its own.
WORKER_STOP_GRACE = 20.0


class NoStopCame(Exception):
    """A worker rank received SIGTERM and rank 0 did not stop the run (not a RuntimeError, which the supervisor turns
    into a failed task)."""


def worker_stop_signals() -> None:
    """SIGTERM to a worker rank. scancel and a scheduler's time limit send it to every task of the job at once, and
    Hydra's mpiexec passes its own on to every rank (https://slurm.schedmd.com/scancel.html, KillWait in
    https://slurm.schedmd.com/slurm.conf.html): rank 0 then stops the run cleanly, and this rank answers its Stop as
    in any clean stop (leaving at once would keep rank 0 waiting for an answer that never comes). Should no Stop come
    within WORKER_STOP_GRACE seconds (this rank alone was signalled), the rank fails as any worker rank that fails
    unexpectedly: it tells rank 0, which gives its tasks up at once, and its `finally` clauses release its shared
    memory and its trainer child."""
    def leave(signum: int, frame: Any) -> None:
        raise NoStopCame(f"SIGTERM, and no Stop from rank 0 within {WORKER_STOP_GRACE:g} s: this rank leaves")

    def on_term(signum: int, frame: Any) -> None:
        if signal.getitimer(signal.ITIMER_REAL)[0] == 0:
            signal.signal(signal.SIGALRM, leave)
            signal.setitimer(signal.ITIMER_REAL, WORKER_STOP_GRACE)

    signal.signal(signal.SIGTERM, on_term)


def _world(world: Callable[[], Any]) -> Any:
    """COMM_WORLD; where the launcher's PMI and the library cannot meet (MPI_Init would abort), the launcher's task
    0 says so in one line and the others leave quietly with the same exit code."""
    from galapagos.launch.mpi import MPIMismatch, launcher_rank

    try:
        return world()
    except MPIMismatch as exc:
        raise (UsageError(str(exc)) if launcher_rank() == 0 else WorkerExit(EXIT_BAD_INPUT)) from None


def check_wired(comm: Any) -> None:
    """Stop when the launcher started several tasks but each is an MPI world of its own (no common PMI): the
    launcher's task 0 says why in one line, the others leave quietly with the same exit code."""
    from galapagos.launch.mpi import launcher_rank, unwired

    if why := unwired(comm.size):
        raise UsageError(why) if launcher_rank() == 0 else WorkerExit(EXIT_BAD_INPUT)


def start_ranks(name: str, opts: Any, workers: int, salvage: Callable[[Any, int], dict | None] | None = None
                ) -> dict | None:
    """Run the job under `mpiexec -n workers+1` and return what its rank 0 returned.

    A job that dies without a result (MPICH ends every rank when one is killed) raises JobFailed, carrying what
    `salvage` makes of the run's files; MPICH's segments that its killed ranks left in /dev/shm are removed."""
    from galapagos.launch.mpi import mpiexec, remove_leftover_segments, shm_segments
    from galapagos.launch.placement import allowed_cores

    if workers < 1:
        raise UsageError(f"--workers {workers}: need at least one worker")
    if workers > (have := len(allowed_cores())):
        log.warning("%d worker(s) on %d core(s): they will take turns on the cores (oversubscribed); fewer workers "
                    "train as fast", workers, have)
    try:
        launcher = mpiexec()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="galapagos-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [launcher, "-n", str(workers + 1), sys.executable, "-m", "galapagos.flows.ranks", name,
               json.dumps(opts.to_dict()), str(result)]
        log.info("starting %d rank(s): %s", workers + 1, " ".join(cmd[:6]) + " ...")
        segments = shm_segments()
        code, signalled = _run_job(cmd, Path(tmp) / "ready", master_watch(opts))
        outcome = json.loads(result.read_text()) if result.exists() else {}
    if code != 0 and (removed := remove_leftover_segments(segments)):
        log.info("removed %d shared-memory segment(s) the job's MPI left in /dev/shm", len(removed))
    if "error" in outcome:
        raise UsageError(outcome["error"])
    if "no_result" in outcome:
        raise NoResult(outcome["no_result"])
    if code not in (0, EXIT_LOST) or "result" not in outcome:
        code = 128 + signal.Signals[signalled] if signalled else code or 1  # ended at once by a second signal
        raise JobFailed(name, code, salvage(opts, code) if salvage else None, stopped=signalled is not None)
    found = outcome["result"]
    for part in (found, (found or {}).get("evolution")):  # the ranks saw SIGUSR1; say what the user sent
        if signalled and isinstance(part, dict) and part.get("stopped_by"):
            part["stopped_by"] = signalled
    return found


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def _run_job(cmd: list[str], ready: Path, watch: Any = None) -> tuple[int, str | None]:
    """Run the job's mpiexec in a session of its own and wait for it: (exit code, the stop signal received).

    A stop signal to this process (Ctrl-C, kill, a scheduler's warning) becomes one SIGUSR1 to mpiexec, which hands
    it to every rank: the run stops cleanly and writes its summary (rank 0 names the signal written to `stop`). It
    is passed on once every rank catches it (the master touches `ready` then; a rank still starting would die of
    it); a second signal ends the job at once (SIGKILL). If this process dies, mpiexec gets SIGTERM
    (PR_SET_PDEATHSIG), which it passes on to every rank: the run stops cleanly, no job trains on unattended.
    If rank 0 stops touching its heartbeat file (`watch`), the job is ended with EXIT_LOST (end_if_master_silent).
    """
    from galapagos.launch.trainer import die_with_parent
    from galapagos.reports.progress import PROGRESS_FILE, ProgressBar

    got: list[int] = []
    try:
        previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in STOP_SIGNALS}
    except ValueError:  # not the main thread: signals stay with whoever owns them
        previous = {}
    stop = ready.with_name("stop")  # the name of the signal passed on as SIGUSR1
    env = {**os.environ, "GALAPAGOS_READY_FILE": str(ready), "GALAPAGOS_STOP_FILE": str(stop)}
    # On a terminal this process draws the progress bar from rank 0's snapshots, the ranks' output above it.
    bar = ProgressBar(ready.with_name("progress.json")) if sys.stderr.isatty() else None
    if bar:
        env[PROGRESS_FILE] = str(bar.path)
    try:
        try:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                    preexec_fn=lambda: die_with_parent(signal.SIGTERM),
                                    **({"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True,
                                        "bufsize": 1} if bar else {}))
        except OSError as exc:
            raise UsageError(f"cannot start {cmd[0]}: {exc.strerror} (install MPI, e.g. pip install mpich, or set "
                             "GALAPAGOS_MPIEXEC to your mpiexec)") from None
        if bar:
            relay = threading.Thread(target=lambda: [bar.write(text) for text in proc.stdout], daemon=True)
            relay.start()
        passed = 0  # signals received when SIGUSR1 went on
        silent = False  # rank 0 stopped touching its heartbeat file: the job was ended
        while proc.poll() is None:
            if bar:
                bar.refresh()
            if got and not passed and ready.exists():
                log.warning("%s: stopping the run cleanly (again to end it at once)", signal.Signals(got[0]).name)
                stop.write_text(signal.Signals(got[0]).name)  # what rank 0 logs and records (launch.runtime)
                proc.send_signal(signal.SIGUSR1)
                passed = len(got)
            elif len(got) > max(passed, 1):
                log.warning("%s again: ending the job now", signal.Signals(got[-1]).name)
                # SIGKILL: Hydra's proxies then SIGKILL every rank at once (a SIGTERM is passed on to the ranks,
                # whose clean stop the user no longer wants to wait for); the trainers die with their ranks.
                proc.kill()
                passed = len(got)
            silent = silent or end_if_master_silent(proc, watch)
            time.sleep(0.1)
        if bar:
            relay.join(timeout=10)
        return EXIT_LOST if silent else proc.returncode, signal.Signals(got[0]).name if got else None
    finally:
        if bar:
            bar.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def master_watch(opts: Any) -> Any:
    """The watch on rank 0's heartbeat file of a job with a run directory (launch/heartbeat.py), made before the job
    starts: a file an earlier job left counts only once this job writes it."""
    from galapagos.launch.heartbeat import MasterWatch
    from galapagos.store.rundir import JournalDir

    out = getattr(opts, "out", None)
    return MasterWatch(JournalDir(out).master_heartbeat) if out else None


def end_if_master_silent(proc: subprocess.Popen, watch: Any) -> bool:
    """Rank 0 has not touched its heartbeat file for its timeout (stopped, hung, or its node frozen): say so in one
    line and end the job. mpiexec is killed; Hydra's proxies then kill every rank with SIGKILL, which ends a stopped
    one too (SIGTERM would wait for it to be continued). Rank 0's end is awaited: it frees the run's lock for the
    summary written from the journal (Flow.salvage). True once the job was ended."""
    if watch is None or (silent := watch.check()) is None:
        return False
    log.error("%s", watch.describe(silent))
    proc.kill()
    proc.wait()
    watch.wait_gone(30.0)
    return True


def user_errors() -> tuple[type[Exception], ...]:
    """The errors that mean bad input: one line and exit code 2 for the user, never a traceback."""
    from galapagos.datashare.format import DataError
    from galapagos.datashare.share import DataShareError
    from galapagos.errors import RunDirError
    from galapagos.evolve.errors import ConfigError
    from galapagos.evolve.netdir import ModelError
    from galapagos.launch.mpi import MPIMismatch
    from galapagos.launch.scripts import JobScriptError
    from galapagos.store.ensembledir import EnsembleError

    return (UsageError, ConfigError, DataError, DataShareError, RunDirError, EnsembleError, ModelError,
            JobScriptError, MPIMismatch)


def end_when_done(comm: Any, state: Any) -> None:
    """Worker ranks stopped answering (state.lost): once this process has written and printed everything, the job
    is aborted with EXIT_LOST (launch.session.abort_if_lost), since a stopped rank would never let it end."""
    from galapagos.launch.session import abort_if_lost

    if state.lost:
        atexit.register(abort_if_lost, comm, state)  # runs before mpi4py's own MPI_Finalize (registered earlier)


def abort(comm: Any, name: str, exc: BaseException, out: str | None) -> None:
    """Rank 0 failed unexpectedly: say why in one line (the traceback goes to OUT/log/crash-rank0.txt when it can),
    then end every rank of the job (MPI_Abort), so that none waits forever."""
    from galapagos.store.rundir import JournalDir

    where = ""
    if out and JournalDir(out).logs.is_dir():
        try:
            crash = JournalDir(out).crash_file(0)
            crash.write_text("".join(traceback.format_exception(exc)))
            where = f"; traceback in {crash}"
        except OSError:
            pass
    print(f"galapagos {name}: error on rank 0: {type(exc).__name__}: {exc}{where}; ending the job", file=sys.stderr,
          flush=True)
    from galapagos.launch.session import flush_then_abort

    flush_then_abort(comm, EXIT_CRASH)
