"""Stop requests: a scheduler warns a job ahead of its wall time and then ends it, and the master ends the run
cleanly on either signal (launch/runtime.py polls stop_signal)."""
from __future__ import annotations

import atexit
import os
import signal
from pathlib import Path
from typing import Any

# A scheduler warns a job ahead of its wall time with SIGUSR1 (Slurm --signal, LSF -wa, the job script's watchdog)
# and ends it with SIGTERM. The master ends the run cleanly on either; workers ignore SIGUSR1 (its default action
# kills) and leave when the master says STOP.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_stop_signals: list[int] = []


def catch_stop_signals() -> None:
    """From now on SIGUSR1 and SIGTERM only record a request to stop (see stop_signal)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda s, frame: _stop_signals.append(s))
    # Python's exit puts its handlers back to the default (die) before MPI_Finalize, which waits for the workers:
    # a SIGUSR1 passed on late would kill rank 0 there and fail a job that stopped cleanly. Nothing is left to stop.
    atexit.register(signal.signal, signal.SIGUSR1, signal.SIG_IGN)


def announce_ready(comm: Any) -> None:
    """Under a `galapagos launch` job script: once every rank catches stop signals (all have passed
    catch_stop_signals), tell the script, which only then passes a SIGUSR1 on (a rank still starting would die)."""
    path = os.environ.get("GALAPAGOS_READY_FILE")
    if path:
        comm.Barrier()
        if comm.rank == 0:
            Path(path).touch()


def stop_signal() -> str | None:
    """The name of the first stop signal received, or None. A SIGUSR1 that the command which started the job passed
    on names the signal the user sent, which that command wrote to $GALAPAGOS_STOP_FILE first (flows/mpijob.py)."""
    name = signal.Signals(_stop_signals[0]).name if _stop_signals else None
    relayed = os.environ.get("GALAPAGOS_STOP_FILE") if name == "SIGUSR1" else None
    return (Path(relayed).read_text().strip() if relayed and os.path.isfile(relayed) else "") or name
