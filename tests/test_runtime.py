"""The master loop (launch.runtime.master_serve) against a fake communicator whose workers are simulated here."""
from __future__ import annotations

import time
from collections import Counter, deque

import pytest

import galapagos.launch.runtime as runtime
from galapagos.launch.protocol import (EXIT_LOST, TAG, Cancel, Progress, RankFailed, Ready, Result, Status, Stop,
                                       Stopped, Task)
from galapagos.launch.runtime import MasterState, master_serve
from galapagos.launch.session import abort_if_lost
from galapagos.launch.slots import Slots


# -- the fake MPI world ----------------------------------------------------------------------------------------------
class Message:
    def __init__(self, obj):
        self.obj = obj

    def recv(self):
        return self.obj


class FakeWorker:
    """Holds the tasks the master sent it (the head runs, the rest are queued) and plays each task's script.

    A script is a list of steps: ("progress", metrics), ("until", predicate) (stays on this step until the
    predicate is true), ("result", fitness, seconds[, metrics]) (the task ends OK), ("fail", error) (the rank fails:
    protocol.RankFailed).
    """

    def __init__(self, rank: int, comm: "FakeComm"):
        self.rank, self.comm = rank, comm
        self.held: deque[Task] = deque()
        self.steps: dict[int, deque] = {}
        self.best: dict[int, float] = {}
        self.stopped = False
        self.ignore_cancel = False
        self.silent = False  # never answers Stop

    def receive(self, obj) -> None:
        if isinstance(obj, Task):
            self.held.append(obj)
            self.steps[obj.id] = deque(self.comm.script(self.rank, obj))
            self.comm.max_held[self.rank] = max(self.comm.max_held[self.rank], len(self.held))
        elif isinstance(obj, Cancel):
            if self.ignore_cancel:
                return
            for task in list(self.held):
                if task.id == obj.id:
                    self.held.remove(task)
                    fitness = self.best.get(task.id) if obj.status == Status.PRUNED else None
                    now = time.time()
                    self.comm.deliver(Result(task.id, self.rank, f"host{self.rank}", obj.status, fitness, now, now))
        elif isinstance(obj, Stop):
            self.stopped = True
            if not self.silent:
                self.comm.deliver(Stopped(self.rank))

    def step(self) -> None:
        """One event of the running task, if it has one to give now."""
        if not self.held:
            return
        task = self.held[0]
        steps = self.steps[task.id]
        if not steps:
            return
        kind, *args = steps[0]
        if kind == "until":
            if args[0]():
                steps.popleft()
            return
        steps.popleft()
        if kind == "progress":
            fit = args[0].get("fitness")
            if fit is not None:
                self.best[task.id] = max(fit, self.best.get(task.id, fit))
            self.comm.deliver(Progress(task.id, self.rank, args[0]))
        elif kind == "fail":  # the rank fails unexpectedly: it says so once, then sends nothing more
            self.held.clear()
            self.silent = True
            self.comm.deliver(RankFailed(self.rank, args[0]))
        elif kind == "result":
            fitness, seconds, *metrics = args
            self.held.popleft()
            start = 1000.0 + task.id
            self.comm.deliver(Result(task.id, self.rank, f"host{self.rank}", Status.OK, fitness, start,
                                     start + seconds, metrics[0] if metrics else {}))


def default_script(rank, task):
    return [("progress", {"epoch": 1, "fitness": 0.1}), ("result", 1.0, 0.5)]


class FakeComm:
    """Rank 0's view of the world: every send is recorded and handed to the simulated worker; a worker's answers
    arrive on a later improbe. When nothing is waiting, an improbe lets every worker take one step."""

    def __init__(self, size: int = 3, script=default_script):
        self.size, self.rank = size, 0
        self.script = script
        self.workers = {r: FakeWorker(r, self) for r in range(1, size)}
        self.inbox: deque = deque(Ready(r, f"host{r}", f"cuda:{r - 1}") for r in range(1, size))
        self.log: list[tuple] = []  # ("send", dest, obj) and ("recv", obj) in the order they happened
        self.max_held = {r: 0 for r in range(1, size)}

    def deliver(self, obj) -> None:
        self.inbox.append(obj)

    def improbe(self, source=None, tag=None):
        assert tag == TAG
        if not self.inbox:
            for w in self.workers.values():
                w.step()
            return None  # the answers come on the next call
        obj = self.inbox.popleft()
        self.log.append(("recv", obj))
        return Message(obj)

    def send(self, obj, dest, tag=None):
        assert tag == TAG
        assert 1 <= dest < self.size, f"sent to rank {dest}"
        self.log.append(("send", dest, obj))
        self.workers[dest].receive(obj)

    # what the tests look at
    def sent(self, kind):
        return [(dest, obj) for entry in self.log if entry[0] == "send" for dest, obj in [entry[1:]]
                if isinstance(obj, kind)]


class ListSource:
    """A fixed list of tasks; records everything the master tells it."""

    def __init__(self, n: int, prune=None, limit: float | None = None):
        self.todo = deque(Task(i, {"n": i}, limit) for i in range(n))
        self.n = n
        self.results: list[Result] = []
        self.progress: list[Progress] = []
        self.ticks = 0
        self.prune = prune or (lambda p: None)

    def next_task(self):
        return self.todo.popleft() if self.todo else None

    def finished(self):
        return len(self.results) >= self.n

    def on_result(self, result):
        self.results.append(result)

    def on_progress(self, progress):
        self.progress.append(progress)
        return self.prune(progress)

    def on_tick(self, state):
        assert isinstance(state, MasterState)
        self.ticks += 1


def serve(comm, source, **kw):
    """master_serve with a guard: a loop that never ends fails the test instead of hanging it."""
    kw.setdefault("tick", 0.01)
    return master_serve(comm, source, **kw)


# -- (a) every task once, prefetch bound -----------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_every_task_runs_exactly_once_and_prefetch_bounds_what_a_worker_holds(prefetch):
    comm = FakeComm(size=3)
    source = ListSource(6)
    state = serve(comm, source, prefetch=prefetch)
    sent_ids = [t.id for _, t in comm.sent(Task)]
    assert sorted(sent_ids) == list(range(6))  # each task sent once
    assert sorted(r.id for r in source.results) == list(range(6))  # and each result reached the source once
    assert all(r.status == Status.OK for r in source.results)
    assert max(comm.max_held.values()) <= prefetch + 1
    # the bound is reached (the prefetch is really used), and both workers got work
    assert max(comm.max_held.values()) == prefetch + 1
    assert {dest for dest, _ in comm.sent(Task)} == {1, 2}
    assert state.running == {}


@pytest.mark.timeout(30)
def test_automatic_prefetch_queues_one_task_once_tasks_are_short():
    comm = FakeComm(size=3)  # default script: 0.5 s per task, below SHORT_TASK
    source = ListSource(10)
    serve(comm, source, prefetch=None)
    assert sorted(r.id for r in source.results) == list(range(10))
    # before any result the depth is 0 (one task each); with short tasks it becomes 1, never more
    assert max(comm.max_held.values()) == 2


@pytest.mark.timeout(30)
def test_automatic_prefetch_queues_nothing_for_long_tasks():
    comm = FakeComm(size=3, script=lambda rank, task: [("result", 1.0, 5.0)])
    source = ListSource(8)
    serve(comm, source, prefetch=None)
    assert sorted(r.id for r in source.results) == list(range(8))
    assert max(comm.max_held.values()) == 1


# -- (b) steady state ------------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_a_result_is_followed_at_once_by_a_new_task_to_the_same_worker():
    comm = FakeComm(size=3)
    done_by_1 = lambda: sum(1 for e in comm.log if e[0] == "recv" and isinstance(e[1], Result) and e[1].rank == 1)

    def script(rank, task):
        if rank == 2 and task.id == 1:  # worker 2's first task runs until worker 1 has finished three
            return [("until", lambda: done_by_1() >= 3), ("result", 0.5, 9.0)]
        return [("result", 1.0, 2.0)]

    comm.script = script
    source = ListSource(10)
    serve(comm, source, prefetch=0)
    assert [t.id for d, t in comm.sent(Task) if d == 2][0] == 1
    long_result = next(i for i, e in enumerate(comm.log) if e[0] == "recv" and isinstance(e[1], Result)
                       and e[1].id == 1)
    results_from_1 = [i for i, e in enumerate(comm.log[:long_result])
                      if e[0] == "recv" and isinstance(e[1], Result) and e[1].rank == 1]
    assert len(results_from_1) >= 3  # worker 1 went on while worker 2 still ran: no generation barrier
    for i in results_from_1:
        following = next(e for e in comm.log[i + 1:] if e[0] == "send")
        assert following[1] == 1 and isinstance(following[2], Task), following
    assert sorted(r.id for r in source.results) == list(range(10))


# -- (c) pruning -----------------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_a_pruned_progress_cancels_that_task_on_its_rank():
    def script(rank, task):
        fit = -1.0 if task.id == 3 else 0.5
        return [("progress", {"epoch": 1, "fitness": fit}), ("progress", {"epoch": 2, "fitness": fit}),
                ("result", fit, 1.0)]

    comm = FakeComm(size=3, script=script)
    source = ListSource(6, prune=lambda p: Status.PRUNED if p.metrics["fitness"] < 0 else None)
    serve(comm, source, prefetch=0)
    rank_of_3 = next(d for d, t in comm.sent(Task) if t.id == 3)
    cancels = comm.sent(Cancel)
    assert cancels == [(rank_of_3, Cancel(3, Status.PRUNED))]  # once: its second epoch never came
    by_id = {r.id: r for r in source.results}
    assert sorted(by_id) == list(range(6))
    assert by_id[3].status == Status.PRUNED and by_id[3].fitness == -1.0
    assert all(r.status == Status.OK for i, r in by_id.items() if i != 3)
    assert [p.metrics["epoch"] for p in source.progress if p.id == 3] == [1]


@pytest.mark.timeout(30)
def test_progress_of_an_unknown_task_is_not_passed_on():
    comm = FakeComm(size=2)
    comm.inbox.append(Progress(99, 1, {"fitness": 0.0}))
    source = ListSource(1, prune=lambda p: Status.PRUNED)
    serve(comm, source, prefetch=0)
    assert all(p.id != 99 for p in source.progress)
    assert not any(c.id == 99 for _, c in comm.sent(Cancel))


@pytest.mark.timeout(30)
def test_a_duplicate_result_reaches_the_source_once():
    comm = FakeComm(size=2, script=lambda rank, task: [("result", 1.0, 1.0)])
    comm.workers[1].step = _duplicating_step(comm.workers[1])
    source = ListSource(2)
    state = serve(comm, source, prefetch=0)
    assert sum(1 for e in comm.log if e[0] == "recv" and isinstance(e[1], Result) and e[1].id == 0) == 2
    assert sorted(r.id for r in source.results) == [0, 1]
    assert state.busy_seconds == pytest.approx(2.0)  # the duplicate is not counted as busy time either


def _duplicating_step(worker):
    """Answer task 0's result twice (a late duplicate must not be counted again)."""
    plain = worker.step

    def step():
        before = len(worker.comm.inbox)
        plain()
        new = list(worker.comm.inbox)[before:]
        for obj in new:
            if isinstance(obj, Result) and obj.id == 0:
                worker.comm.inbox.append(obj)
    return step


# -- (d) deadline and stop -------------------------------------------------------------------------------------------
def forever(rank, task):
    return [("progress", {"epoch": 1, "fitness": 0.1}), ("until", lambda: False)]


@pytest.mark.timeout(30)
def test_a_deadline_in_the_past_stops_every_worker_without_running_anything():
    comm = FakeComm(size=4)
    source = ListSource(6)
    state = serve(comm, source, deadline=time.time() - 1.0)
    assert comm.sent(Task) == []
    assert sorted(d for d, _ in comm.sent(Stop)) == [1, 2, 3]
    assert all(w.stopped for w in comm.workers.values())
    assert state.stopping


@pytest.mark.timeout(30)
def test_a_passing_deadline_cancels_running_tasks_then_stops_the_workers():
    comm = FakeComm(size=3, script=forever)
    source = ListSource(6)
    t0 = time.time()
    state = serve(comm, source, deadline=t0 + 0.3, prefetch=1)
    assert time.time() - t0 >= 0.3
    sent = comm.sent(Task)
    assert len(sent) == 4  # two per worker (prefetch 1), then nothing ran to an end
    cancels = comm.sent(Cancel)
    assert sorted((d, c.id) for d, c in cancels) == sorted((d, t.id) for d, t in sent)
    assert all(c.status == Status.CANCELLED for _, c in cancels)
    assert sorted(r.id for r in source.results) == sorted(t.id for _, t in sent)
    assert all(r.status == Status.CANCELLED for r in source.results)
    _assert_cancel_then_stop_at_once(comm)
    assert state.running == {}


@pytest.mark.timeout(30)
def test_a_deadline_that_moves_is_polled_and_ends_the_loop_when_it_passes():
    """A deadline given as a function (the evolution run's: the time budget less the final ensemble's build, which
    grows as the kept networks change) is read afresh by the loop: here it comes forward once two results are in."""
    comm = FakeComm(size=3)
    source = ListSource(100)
    state = serve(comm, source, deadline=lambda: time.time() + 60 if len(source.results) < 2 else time.time() - 1)
    assert 2 <= len(source.results) < 100 and state.stopping
    assert all(w.stopped for w in comm.workers.values())
    assert serve(FakeComm(size=3), ListSource(4), deadline=lambda: None).stopping is False  # None: no deadline


@pytest.mark.timeout(30)
def test_a_stop_request_cancels_running_tasks_and_no_new_task_follows():
    comm = FakeComm(size=3, script=forever)
    source = ListSource(10)
    asked = []

    def stop():
        asked.append(1)
        # stop once both workers have reported an epoch
        return "SIGTERM" if len({p.rank for p in source.progress}) == 2 else None

    state = serve(comm, source, stop=stop, prefetch=0)
    assert asked
    first_cancel = next(i for i, e in enumerate(comm.log) if e[0] == "send" and isinstance(e[2], Cancel))
    assert not any(e[0] == "send" and isinstance(e[2], Task) for e in comm.log[first_cancel:])
    cancels = comm.sent(Cancel)
    assert sorted(d for d, _ in cancels) == [1, 2]
    assert all(c.status == Status.CANCELLED for _, c in cancels)
    assert [r.status for r in source.results] == [Status.CANCELLED] * 2
    _assert_cancel_then_stop_at_once(comm)
    assert state.stopping


@pytest.mark.timeout(30)
def test_a_stop_does_not_wait_for_cancelled_tasks_and_tells_the_source_of_each():
    comm = FakeComm(size=3, script=forever)
    for w in comm.workers.values():
        w.ignore_cancel = True  # they would never report: the master must not wait for them
    source = ListSource(4)
    t0 = time.time()
    state = serve(comm, source, stop=lambda: "SIGUSR1" if len(source.progress) == 2 else None, prefetch=0)
    assert time.time() - t0 < 5
    assert sorted(d for d, _ in comm.sent(Cancel)) == [1, 2]
    assert all(w.stopped for w in comm.workers.values())
    _assert_cancel_then_stop_at_once(comm)
    # a CANCELLED result for each abandoned task, made on the master, so that the source cleans up
    assert sorted((r.id, r.rank, r.host) for r in source.results) == [(0, 1, "host1"), (1, 2, "host2")]
    assert all(r.status == Status.CANCELLED and r.fitness is None and r.seconds == 0 for r in source.results)
    assert state.running == {} and state.busy_seconds == 0.0


@pytest.mark.timeout(30)
def test_a_result_that_arrived_with_the_stop_is_kept():
    comm = FakeComm(size=3, script=lambda rank, task: [("result", 1.0, 1.0)] if rank == 1 else forever(rank, task))
    source = ListSource(4)
    received = lambda: any(e[0] == "recv" and isinstance(e[1], Result) for e in comm.log)
    serve(comm, source, stop=lambda: "SIGTERM" if received() else None, prefetch=0)
    assert [(r.id, r.status) for r in sorted(source.results, key=lambda r: r.id)] == [(0, Status.OK),
                                                                                        (1, Status.CANCELLED)]
    assert [(d, c.id) for d, c in comm.sent(Cancel)] == [(2, 1)]


def _assert_cancel_then_stop_at_once(comm):
    """The run ends with Cancel for each running task, then Stop to every worker, nothing read in between."""
    stops = [i for i, e in enumerate(comm.log) if e[0] == "send" and isinstance(e[2], Stop)]
    assert sorted(comm.log[i][1] for i in stops) == list(range(1, comm.size))
    assert stops == list(range(stops[0], stops[0] + len(stops)))  # together
    first_cancel = next((i for i, e in enumerate(comm.log) if e[0] == "send" and isinstance(e[2], Cancel)), stops[0])
    assert all(e[0] == "send" and isinstance(e[2], (Cancel, Stop)) for e in comm.log[first_cancel:stops[-1]])
    _assert_stopped_answers_read_last(comm, stops[-1])


def _assert_stopped_answers_read_last(comm, last_stop):
    """After the stops the master only reads, up to every worker's answer (nothing stays unread for MPICH)."""
    after = comm.log[last_stop + 1:]
    assert all(e[0] == "recv" for e in after)
    answered = [e[1].rank for e in after if isinstance(e[1], Stopped)]
    assert sorted(answered) == sorted(r for r, w in comm.workers.items() if w.stopped and not w.silent)
    assert isinstance(after[-1][1], Stopped)


def _assert_stop_comes_last(comm):
    sends = [e for e in comm.log if e[0] == "send"]
    stops = [e for e in sends if isinstance(e[2], Stop)]
    assert sorted(e[1] for e in stops) == list(range(1, comm.size))
    assert sends[-len(stops):] == stops  # nothing after the stops
    last_result = max(i for i, e in enumerate(comm.log) if e[0] == "recv" and isinstance(e[1], Result))
    assert last_result < comm.log.index(stops[0])  # every task reported before the workers were stopped
    _assert_stopped_answers_read_last(comm, comm.log.index(stops[-1]))


@pytest.mark.timeout(30)
def test_the_master_reads_what_workers_sent_before_they_saw_stop():
    """Messages still in flight when Stop goes out are read (and dropped) up to each worker's answer."""
    comm = FakeComm(size=3, script=forever)
    source = ListSource(4)
    late = Result(99, 1, "host1", Status.OK, 1.0, 0.0, 1.0)
    stop_1 = comm.workers[1].receive

    def receive(obj):  # worker 1 reports once more before it reads Stop
        if isinstance(obj, Stop):
            comm.deliver(late)
        stop_1(obj)
    comm.workers[1].receive = receive
    serve(comm, source, stop=lambda: "SIGTERM" if len(source.progress) == 2 else None, prefetch=0)
    assert ("recv", late) in comm.log and all(r.id != 99 for r in source.results)
    _assert_cancel_then_stop_at_once(comm)


@pytest.mark.timeout(30)
def test_a_worker_that_never_answers_stop_delays_the_end_only_so_long(monkeypatch):
    monkeypatch.setattr(runtime, "STOPPED_WAIT", 0.3)
    comm = FakeComm(size=3)
    comm.workers[2].silent = True
    t0 = time.time()
    serve(comm, ListSource(2), prefetch=0)
    assert 0.3 <= time.time() - t0 < 5


# -- (f) a worker rank that stops answering --------------------------------------------------------------------------
def takes(seconds):
    """A script step that lasts `seconds` from when the task reaches it."""
    end = []

    def done():
        if not end:
            end.append(time.time() + seconds)
        return time.time() >= end[0]
    return ("until", done)


@pytest.mark.timeout(30)
def test_a_rank_silent_past_the_limit_and_the_grace_is_lost_and_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(runtime, "LOST_GRACE", 0.2)
    comm = FakeComm(size=3)
    source = ListSource(12, limit=0.1)
    lost = lambda: any(r.status == Status.LOST for r in source.results)

    def script(rank, task):
        if rank == 2:  # silent until the master gave it up, then its result comes late
            return [("until", lost), ("result", 5.0, 0.05)]
        return [takes(0.05), ("result", 1.0, 0.05)]

    comm.script = script
    t0 = time.time()
    state = serve(comm, source, prefetch=0)
    assert time.time() - t0 < 10
    assert state.lost == {2}
    by_id = {r.id: r for r in source.results}
    assert sorted(by_id) == list(range(12)) and len(source.results) == 12  # each task reached the source once
    first_to_2 = [t.id for d, t in comm.sent(Task) if d == 2]
    assert len(first_to_2) == 1  # no further task went to the lost rank
    gone = by_id[first_to_2[0]]
    assert (gone.status, gone.fitness, gone.rank, gone.host) == (Status.LOST, None, 2, "host2")
    assert gone.seconds >= 0.3 and "stopped answering" in gone.error
    assert all(r.status == Status.OK and r.rank == 1 for i, r in by_id.items() if i != gone.id)
    # the late result was read and ignored: not recorded again, not counted as busy time
    assert any(e[0] == "recv" and isinstance(e[1], Result) and e[1].rank == 2 for e in comm.log)
    assert state.busy_seconds == pytest.approx(11 * 0.05)
    assert [d for d, _ in comm.sent(Stop)] == [1]  # a lost rank would never read it


@pytest.mark.timeout(30)
def test_a_rank_that_fails_is_given_up_at_once():
    """No time limit and the default grace: only the rank's own word (RankFailed) can end its tasks here."""
    def script(rank, task):
        return [("progress", {"epoch": 1}), ("fail", "RuntimeError: boom")] if rank == 2 else [("result", 1.0, 0.05)]

    comm = FakeComm(size=3, script=script)
    source = ListSource(8)
    state = serve(comm, source, prefetch=1)
    assert state.lost == {2}
    to_2 = [t.id for d, t in comm.sent(Task) if d == 2]
    assert len(to_2) == 2  # what it held when it failed (running and queued); nothing after
    lost = [r for r in source.results if r.rank == 2]
    assert sorted(r.id for r in lost) == sorted(to_2)
    assert all(r.status == Status.LOST and r.error == "worker rank 2 failed" for r in lost)
    assert sorted(r.id for r in source.results) == list(range(8))
    assert all(r.status == Status.OK for r in source.results if r.rank == 1)
    assert [d for d, _ in comm.sent(Stop)] == [1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("grace, script, tasks, limit, deadline, prefetch, statuses", [
    # a queued task is timed from the end of the one before: 0.4 s each, within 0.6 s of its start, not its sending
    (0.3, lambda rank, task: [takes(0.4), ("result", 1.0, 0.4)], 3, 0.3, None, 1, [Status.OK] * 3),
    # a task without a time limit is never overdue (here it runs until the deadline cancels it)
    (0.0, forever, 4, None, 0.5, 0, [Status.CANCELLED] * 2),
])
def test_a_rank_is_not_lost_while_its_task_may_still_run(monkeypatch, grace, script, tasks, limit, deadline, prefetch,
                                                         statuses):
    monkeypatch.setattr(runtime, "LOST_GRACE", grace)
    comm = FakeComm(size=3, script=script)
    source = ListSource(tasks, limit=limit)
    state = serve(comm, source, deadline=deadline and time.time() + deadline, prefetch=prefetch)
    assert state.lost == set()
    assert [r.status for r in source.results] == statuses


@pytest.mark.timeout(30)
def test_when_every_rank_is_lost_the_loop_ends(monkeypatch):
    monkeypatch.setattr(runtime, "LOST_GRACE", 0.1)
    comm = FakeComm(size=3, script=forever)
    source = ListSource(6, limit=0.1)
    state = serve(comm, source, prefetch=1)
    assert state.lost == {1, 2}
    assert sorted(r.id for r in source.results) == [0, 1, 2, 3]  # what they held, then nothing more was sent
    assert all(r.status == Status.LOST for r in source.results) and len(comm.sent(Task)) == 4
    assert comm.sent(Stop) == []
    assert not source.finished()


@pytest.mark.timeout(30)
def test_the_grace_can_be_given_to_the_loop():
    comm = FakeComm(size=2, script=forever)
    state = serve(comm, ListSource(2, limit=0.05), lost_grace=0.05)
    assert state.lost == {1}


class Aborted(Exception):
    pass


class AbortingComm:
    """MPI_Abort ends the process; here it raises, so that abort_if_lost does not reach its os._exit."""

    def __init__(self):
        self.aborted = []

    def Abort(self, code):
        self.aborted.append(code)
        raise Aborted


def test_abort_if_lost_aborts_the_job_only_when_ranks_were_lost():
    comm = AbortingComm()
    abort_if_lost(comm, MasterState(workers=2))
    assert comm.aborted == []
    with pytest.raises(Aborted):
        abort_if_lost(comm, MasterState(workers=2, lost={2}))
    assert comm.aborted == [EXIT_LOST]


# -- (g) a failing source --------------------------------------------------------------------------------------------
class FullDisk(ListSource):
    def on_result(self, result):
        raise OSError(28, "No space left on device")


@pytest.mark.timeout(30)
def test_an_exception_in_the_loop_still_stops_every_worker():
    comm = FakeComm(size=4)
    with pytest.raises(OSError, match="No space"):
        serve(comm, FullDisk(6), prefetch=0)
    assert sorted(d for d, _ in comm.sent(Stop)) == [1, 2, 3]
    assert all(w.stopped for w in comm.workers.values())


# -- (e) the end -----------------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_the_loop_ends_when_the_source_is_finished_and_returns_the_state():
    seconds = {0: 1.5, 1: 2.0, 2: 0.25, 3: 4.0, 4: 3.0}
    comm = FakeComm(size=3, script=lambda rank, task: [("result", 1.0, seconds[task.id])])
    source = ListSource(5)
    state = serve(comm, source, prefetch=0)
    assert isinstance(state, MasterState)
    assert state.busy_seconds == pytest.approx(sum(seconds.values()))
    assert state.workers == 2 and state.busy == 0 and not state.stopping
    assert state.hosts == {1: "host1", 2: "host2"} and state.devices == {1: "cuda:0", 2: "cuda:1"}
    assert source.finished() and source.ticks > 0
    _assert_stop_comes_last(comm)


class HandedOutSource(ListSource):
    """finished() as soon as every task has been handed out: the master must still wait for the running ones."""

    def finished(self):
        return not self.todo


@pytest.mark.timeout(30)
def test_the_loop_waits_for_running_tasks_even_when_the_source_is_finished():
    comm = FakeComm(size=3, script=lambda rank, task: [("progress", {"fitness": 0.0})] * 5 + [("result", 1.0, 1.0)])
    source = HandedOutSource(4)
    state = serve(comm, source, prefetch=1)
    assert sorted(r.id for r in source.results) == [0, 1, 2, 3]
    assert state.running == {}
    assert state.busy_seconds == pytest.approx(4.0)


@pytest.mark.timeout(30)
def test_an_empty_source_stops_the_workers_at_once():
    comm = FakeComm(size=3)
    source = ListSource(0)
    state = serve(comm, source)
    assert comm.sent(Task) == []
    assert sorted(d for d, _ in comm.sent(Stop)) == [1, 2]
    assert state.busy_seconds == 0.0


def test_slots_find_the_least_loaded_rank_and_count_the_busy_ones():
    slots = Slots()
    for rank in (1, 2, 3):
        slots.add(rank)
    assert slots.least_loaded(0) == 1 and slots.busy == 0
    slots.change(1, 1)
    slots.change(2, 1)
    assert slots.least_loaded(0) == 3 and slots.busy == 2
    slots.change(3, 1)
    assert slots.least_loaded(0) is None and slots.least_loaded(1) in (1, 2, 3)
    slots.change(2, -1)
    slots.remove(3)  # a lost rank
    assert slots.least_loaded(0) == 2 and slots.busy == 1 and slots.held == {1: 1, 2: 0}


def test_the_master_loop_at_scale_with_simulated_workers():
    """bench/scale.py's simulation end to end, small: every task is answered and journalled, none lost."""
    from bench import scale

    out = scale.one(workers=50, minutes=0.5, median=5.0, sigma=0.6)
    assert runtime.time is time  # the simulation's clock is gone again
    assert out["tasks"] > 50 and out["lost"] == 0 and sum(out["by_status"].values()) <= out["tasks"]
    assert 0 < out["utilization"] <= 1


def test_the_master_loop_makes_next_to_no_cyclic_garbage(monkeypatch):
    """master_serve turns the cyclic collector off while it serves (launch/runtime.py): what the loop leaves in
    reference cycles stays until it ends. The real evolution source under bench/scale.py's simulated workers leaves
    a few (the JSON encoder of each best network's files, written when the best improves), not some per task: a
    cycle made per task would grow rank 0 for hours."""
    import gc

    from bench import scale

    found, during = [], []

    class Watched(ListSource):
        def next_task(self):
            during.append(gc.isenabled())
            return super().next_task()

    serve(FakeComm(size=3, script=lambda rank, task: [("result", 1.0, 0.1)]), Watched(4), prefetch=0)
    assert during and not any(during) and gc.isenabled()  # off in the loop, on again after it

    def counted(*args, **kw):  # the collector off here already: the loop leaves it off, and nothing is collected
        gc.collect()  # between the loop's end and the count below
        gc.disable()
        try:
            state = master_serve(*args, **kw)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            found.extend(type(o).__name__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        return state

    monkeypatch.setattr(runtime, "master_serve", counted)
    out = scale.one(workers=300, minutes=0.5, median=5.0, sigma=0.6)
    assert out["tasks"] > 1000 and len(found) < 0.5 * out["tasks"], (out["tasks"], Counter(found).most_common(5))
