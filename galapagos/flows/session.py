"""One job's life on rank 0, the same for every flow that serves tasks (evolve, ensemble, design): the checks made
before the workers are set up, their setup and the data, serving tasks, and the end.

    with MasterSession(comm) as session:
        with session.starting():       # bad input here: the waiting workers are told to leave (SetupFailed)
            ...                        # checks, the run directory's lock (session.hold), the engine
        session.start(setup, plan, memory)
        state = session.serve(source)  # closes the shared data and what session.while_serving registered

A job of several phases (design: evolution, then the ensemble on the same workers) goes through starting, start
and serve once per phase; `fail` tells workers waiting for a phase that it will not come.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from galapagos.datashare.plan import Plan
from galapagos.datashare.share import DataShareError
from galapagos.errors import UsageError
from galapagos.flows.mpijob import end_when_done, user_errors
from galapagos.launch.protocol import Liveness, Setup, SetupFailed
from galapagos.launch.runtime import MasterState, TaskSource, master_serve
from galapagos.launch.signals import stop_signal
from galapagos.launch.session import master_start


class MasterSession:
    """Rank 0's side of one job: hold resources for the whole job (`hold`) or for one phase's serving
    (`while_serving`); release them in reverse order, whatever happens."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.workers = comm.size - 1
        self._job = ExitStack()  # until the session ends: e.g. the run directory's lock
        self._phase = ExitStack()  # until the phase's serving ends: the shared data, the engine, the journal
        self.set_up = False  # the workers of this phase got their setup (or were told to leave)
        self._undo: list[Callable[[], Any]] = []  # what a refused start takes back (see on_refusal)
        self.liveness = Liveness()  # the heartbeat settings of this phase's setup, which serving follows too

    def __enter__(self) -> MasterSession:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._phase.close()
        finally:
            self._job.close()

    def hold(self, release: Callable[[], Any]) -> None:
        """Call `release` when the session ends."""
        self._job.callback(release)

    def on_refusal(self, undo: Callable[[], Any]) -> None:
        """Call `undo` if this phase's start is refused (bad input found in `starting`, or as the data is shared),
        before what the session holds is released: e.g. a refused run leaves its directory as it found it."""
        self._undo.append(undo)

    def _refused(self) -> None:
        while self._undo:
            self._undo.pop()()

    def while_serving(self, close: Callable[[], Any]) -> None:
        """Call `close` when this phase's serving ends (or its start fails)."""
        self._phase.callback(close)

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Rank 0 before it sets the workers up: on bad input (or a file it cannot write) the waiting workers are
        told to leave, then the error is raised as a UsageError."""
        try:
            yield
        except (*user_errors(), ValueError, OSError) as exc:
            self.fail(str(exc))
            self._refused()
            raise UsageError(str(exc)) from None

    def fail(self, reason: str) -> None:
        """Tell the workers waiting for this phase's setup that it will not come: they leave."""
        if not self.set_up:
            master_start(self.comm, SetupFailed(reason))
            self.set_up = True

    def start(self, setup: Setup, plan: Plan | dict | None = None, memory: dict | None = None) -> None:
        """Send every worker its setup and share the data into one copy per node."""
        self.set_up, self.liveness = True, setup.liveness
        try:
            shared = master_start(self.comm, setup, plan, memory)
        except DataShareError as exc:
            self._phase.close()
            self._refused()
            raise UsageError(str(exc)) from None
        self._undo.clear()  # the phase has begun
        if shared is not None:
            self.while_serving(shared.close)

    def serve(self, source: TaskSource, **options: Any) -> MasterState:
        """Serve the source's tasks until it is done, the deadline passes or a stop signal comes; then release what
        the phase held. Worker ranks lost on the way end the job once rank 0 has written everything."""
        try:
            state = master_serve(self.comm, source, stop=stop_signal, liveness=self.liveness, **options)
        finally:
            self.set_up = False  # the workers wait for the next phase's setup, if the job has one
            self._phase.close()
        end_when_done(self.comm, state)
        return state
