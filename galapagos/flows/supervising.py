"""A job script's one command, `galapagos supervise`: the ranks on the allocation's nodes, started again with
--resume on the nodes that answer after a lost node or rank (galapagos/flows/recovery.py has the loop and the
probes).

`galapagos launch` writes, beside each script, the scheduler's ranks file (launch/scripts/body.py): `bash FILE
launch NODE_FILE WORD...` starts the ranks on the nodes NODE_FILE lists (rank 0 on the first), `bash FILE probe NODE`
runs one task on NODE through the launcher. On a plain host list the ranks run under this installation's Hydra
mpiexec (`hydra_ranks`). The script's stop relay keeps working: a SIGUSR1 to this process reaches the ranks
(mpijob._run_job passes it on to the launcher once rank 0 says every rank catches it), and ends the restarts.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from galapagos.errors import UsageError
from galapagos.flows.mpijob import STOP_SIGNALS, _run_job
from galapagos.flows.recovery import Outcome, Policy, supervise
from galapagos.store.rundir import JournalDir

JOB_COMMANDS = ("evolve", "ensemble", "design")


def hydra_ranks(nodes: Sequence[str], per_node: int, words: Sequence[str]) -> list[str]:
    """This installation's Hydra mpiexec on a host list: rank 0 and `per_node` workers on the first node, then
    `per_node` on each other one (Hydra fills `-hosts h1:c1,h2:c2` host by host). Hydra reads HYDRA_LAUNCHER,
    HYDRA_LAUNCHER_EXEC and its other variables from the environment
    (https://github.com/pmodels/mpich/blob/main/doc/wiki/how_to/Using_the_Hydra_Process_Manager.md)."""
    from galapagos.launch.mpi import mpiexec

    hosts = ",".join(f"{node}:{per_node + (i == 0)}" for i, node in enumerate(nodes))
    return [mpiexec(), "-hosts", hosts, "-n", str(len(nodes) * per_node + 1), *words]


def hydra_probe(node: str) -> list[str]:
    """One task on `node` through Hydra: its proxy is started there by the launcher and must call back."""
    from galapagos.launch.mpi import mpiexec

    return [mpiexec(), "-hosts", node, "-n", "1", "true"]


def read_nodes(path: str | os.PathLike) -> list[str]:
    """A file of node names, one a line (`host` or `host:count` as Hydra's host files have them), in order, once."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--nodes {path}: {exc.strerror}") from None
    names = [line.split(":")[0].split()[0] for line in lines if line.strip() and not line.startswith("#")]
    if not names:
        raise UsageError(f"--nodes {path}: lists no node")
    return list(dict.fromkeys(names))


def supervise_job(words: list[str], nodes: list[str], policy: Policy, *, ranks: str | None = None,
                  per_node: int = 1) -> tuple[Outcome, dict | None]:
    """Run a job's ranks on `nodes` and restart them with --resume on the nodes that answer, as `supervise` says.

    `words`: how the nodes start galapagos, then the job's command (`.../python -m galapagos.cli evolve ...`).
    `ranks`: the scheduler's ranks file `galapagos launch` wrote beside the script (`bash FILE launch NODE_FILE
    WORD...` starts the ranks on the nodes the file lists, `bash FILE probe NODE` one task on NODE); without it,
    Hydra on the host list (hydra_ranks). Returns the outcome and, when it gave up, the run's summary as the
    flow's salvage writes it from the journal."""
    at = next((i for i, w in enumerate(words) if w in JOB_COMMANDS), None)
    if at is None:
        raise UsageError(f"supervise: no galapagos job ({', '.join(JOB_COMMANDS)}) in the command after --")
    program, command = words[:at], list(words[at:])
    opts, again = _options(command), resume_words(command)
    if again is None:
        policy = replace(policy, max_restarts=0)  # a job that cannot be resumed is not restarted
    run = JournalDir(opts.out)
    ready = Path(os.environ.get("GALAPAGOS_READY_FILE") or run.path.parent / f".ready-{os.getpid()}")
    stop: list[int] = []
    for signum in STOP_SIGNALS:  # between attempts a stop request means no restart; during one, _run_job relays it
        signal.signal(signum, lambda s, frame: stop.append(s))

    def attempt(now: list[str], resume: bool) -> tuple[int, bool]:
        if stop:
            return 128 + stop[0], True
        words_now = [*program, *(again if again and run.config.exists() else command)]
        if ranks:
            listed = Path(ranks).with_name(f"nodes-now-{os.getpid()}")
            listed.write_text("".join(f"{n}\n" for n in now))
            argv = ["bash", ranks, "launch", str(listed), *words_now]
        else:
            argv = hydra_ranks(now, per_node, words_now)
        ready.unlink(missing_ok=True)
        code, signalled = _run_job(argv, ready)
        return code, bool(signalled or stop)

    probe = (lambda node: ["bash", ranks, "probe", node]) if ranks else hydra_probe
    try:
        outcome = supervise(attempt, nodes, probe, policy, suspects=run_lost_hosts(run))
    finally:
        if ranks:
            Path(ranks).with_name(f"nodes-now-{os.getpid()}").unlink(missing_ok=True)
        if "GALAPAGOS_READY_FILE" not in os.environ:
            ready.unlink(missing_ok=True)
    summary = None
    if outcome.gave_up:
        from galapagos.api import FLOWS

        flow = FLOWS[command[0]].load()
        summary = flow.salvage(opts, outcome.code) if flow.salvage else None
    return outcome, summary


def run_lost_hosts(run: Any) -> Callable[[float], list[str] | None]:
    """The hosts of the ranks rank 0 gave up during an attempt begun at `since` (the store's record), if any."""
    return lambda since: run.lost_hosts(since)


def resume_words(command: list[str]) -> list[str] | None:
    """The job command that continues its run (jobs.resume_command: --resume, the run's own config), without
    --seed-from, which the run applied when it began; None for a command that cannot resume."""
    from galapagos.jobs import resume_command, without_option

    try:
        return list(resume_command(tuple(without_option(tuple(command), "--seed-from"))))
    except UsageError:
        return None


def _options(command: list[str]) -> Any:
    from galapagos.jobs import parse_command
    from galapagos.options import EnsembleOptions, EvolveOptions

    args = parse_command(command)
    return (EnsembleOptions if args.command == "ensemble" else EvolveOptions).from_args(args)
