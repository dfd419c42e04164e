"""The trainer child (python -m galapagos.launch.trainer FD) and its pipe protocol, with a real child process."""
from __future__ import annotations

import math
import subprocess
import sys
from multiprocessing import Pipe
from pathlib import Path

import pytest

from galapagos.launch.protocol import (Cancel, Outcome, Progress, Status, Stop, Task, TrainerFailed, TrainerReady,
                                       TrainerSetup)

REPO = Path(__file__).resolve().parent.parent
WAIT = 60.0  # seconds for any one message: the child imports nothing heavy, so a hang is what this catches
TASKS = "tests.trainer_tasks"


class Child:
    """One trainer child over a pipe, started the way launch/supervisor.py starts it."""

    def __init__(self, log: Path):
        self.conn, child = Pipe()
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "galapagos.launch.trainer", str(child.fileno())],
                                         pass_fds=[child.fileno()], cwd=REPO, stdout=out, stderr=out)
        child.close()

    def send(self, msg) -> None:
        self.conn.send(msg)

    def recv(self, timeout: float = WAIT):
        if not self.conn.poll(timeout):
            pytest.fail(f"no message from the trainer child in {timeout} s; its log:\n{self.log.read_text()}")
        return self.conn.recv()

    def setup(self, task_fn: str, rank: int = 1, cores=None):
        self.send(TrainerSetup(rank=rank, task_fn=task_fn, data=None, cores=cores, device="cpu", threads=1))
        return self.recv()

    def run(self, task: Task) -> tuple[list[Progress], Outcome]:
        """Send one task; the Progress messages it streamed and the Outcome that ends it."""
        self.send(task)
        progress = []
        while True:
            msg = self.recv()
            if isinstance(msg, Outcome):
                return progress, msg
            assert isinstance(msg, Progress), msg
            progress.append(msg)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)
        self.conn.close()


@pytest.fixture
def child(tmp_path):
    c = Child(tmp_path / "trainer.log")
    yield c
    c.close()


@pytest.fixture
def ready(child):
    """A child set up with tests/trainer_tasks.py's `scripted`."""
    reply = child.setup(f"{TASKS}:scripted")
    assert isinstance(reply, TrainerReady)
    return child


def test_setup_answers_ready_with_the_child_pid(child):
    reply = child.setup(f"{TASKS}:scripted")
    assert reply == TrainerReady(child.proc.pid)


def test_the_task_sees_its_setup(child):
    assert isinstance(child.setup(f"{TASKS}:describe", rank=3, cores=(0,)), TrainerReady)
    progress, out = child.run(Task(41, None))
    assert progress == [Progress(41, 3, {"epoch": 1, "fitness": 0.0})]  # progress carries the rank it was given
    assert out.status == Status.OK and out.id == 41
    m = out.metrics
    assert (m["task_id"], m["rank"], m["device"], m["threads"], m["data"]) == (41, 3, "cpu", 1, [])
    assert m["cores"] == [0]  # bound to the cores it was given
    assert m["pid"] == child.proc.pid  # the task ran in the child, not here


@pytest.mark.parametrize("task_fn, words", [
    (f"{TASKS}:no_such_function", "AttributeError"),
    ("no_such_module_anywhere:fn", "ModuleNotFoundError"),
    ("tests.trainer_tasks", "expected 'module:function'"),
])
def test_a_bad_task_function_fails_the_setup_with_the_reason(child, task_fn, words):
    reply = child.setup(task_fn)
    assert isinstance(reply, TrainerFailed)
    assert words in reply.reason
    assert child.proc.wait(timeout=WAIT) != 0  # and the child does not stay around


def test_a_task_streams_progress_then_one_outcome(ready):
    curve = [0.25, 0.5, 0.4]
    progress, out = ready.run(Task(5, {"curve": curve, "fitness": 0.5}))
    assert progress == [Progress(5, 1, {"epoch": e, "fitness": f}) for e, f in enumerate(curve, 1)]
    assert out == Outcome(5, Status.OK, 0.5, {"epochs": 3})
    assert isinstance(out.fitness, float)
    assert not ready.conn.poll(0.2)  # nothing after the outcome


def test_a_task_without_progress_gives_just_its_outcome(ready):
    progress, out = ready.run(Task(6, {"fitness": 2}))
    assert progress == [] and out == Outcome(6, Status.OK, 2.0, {"epochs": 0})


@pytest.mark.parametrize("task_fn, status, words", [
    ("raises", Status.FAILED, "RuntimeError: injected failure {'x': 1}"),
    ("diverges", Status.NAN, "FloatingPointError: loss became nan at step 7"),
    ("says_oom", Status.OOM, "CUDA out of memory"),
    ("no_memory", Status.OOM, "MemoryError"),
    ("returns_inf", Status.NAN, "non-finite fitness: inf"),
    ("returns_nothing", Status.NAN, "non-finite fitness: None"),
])
def test_every_failure_becomes_an_outcome_and_the_child_lives_on(child, task_fn, status, words):
    assert isinstance(child.setup(f"{TASKS}:{task_fn}"), TrainerReady)
    _, out = child.run(Task(9, {"x": 1}))
    assert (out.id, out.status, out.fitness) == (9, status, None)
    assert words in out.error
    _, again = child.run(Task(10, {"x": 2}))  # the same child takes the next task
    assert again.id == 10 and again.status == status
    assert child.proc.poll() is None


def test_a_nan_fitness_is_status_nan(ready):
    _, out = ready.run(Task(11, {"curve": [0.1], "fitness": float("nan")}))
    assert out.status == Status.NAN and out.fitness is None
    assert "non-finite" in out.error


@pytest.mark.parametrize("status", [Status.PRUNED, Status.CANCELLED])
def test_a_cancel_during_progress_ends_the_task_with_its_status(child, status):
    assert isinstance(child.setup(f"{TASKS}:rises_until_cancelled"), TrainerReady)
    child.send(Task(12, None))
    seen = [child.recv() for _ in range(3)]
    assert all(isinstance(p, Progress) and p.id == 12 and p.rank == 1 for p in seen)
    child.send(Cancel(12, status))
    while True:
        msg = child.recv()
        if isinstance(msg, Outcome):
            break
        seen.append(msg)
    assert msg.id == 12 and msg.status == status
    if status == Status.PRUNED:  # a pruned candidate keeps its best fitness so far
        assert msg.fitness == max(p.metrics["fitness"] for p in seen)
        assert math.isfinite(msg.fitness) and msg.fitness >= 0.3
    else:
        assert msg.fitness is None
    # the child is free again
    child.send(Stop())
    assert child.proc.wait(timeout=WAIT) == 0


def test_a_cancel_for_another_task_is_ignored(ready):
    ready.send(Cancel(99, Status.PRUNED))  # for a task that already ended, arriving between tasks
    progress, out = ready.run(Task(13, {"curve": [0.1, 0.2], "fitness": 0.2}))
    assert out == Outcome(13, Status.OK, 0.2, {"epochs": 2}) and len(progress) == 2


def test_a_cancel_for_another_task_during_a_task_is_ignored(child):
    assert isinstance(child.setup(f"{TASKS}:rises_until_cancelled"), TrainerReady)
    child.send(Task(14, None))
    assert isinstance(child.recv(), Progress)
    child.send(Cancel(13, Status.PRUNED))  # late, for the task before
    for _ in range(5):  # the task goes on
        msg = child.recv()
        assert isinstance(msg, Progress) and msg.id == 14, msg
    child.send(Cancel(14, Status.CANCELLED))
    while isinstance(msg := child.recv(), Progress):
        pass
    assert (msg.id, msg.status, msg.fitness) == (14, Status.CANCELLED, None)


def test_the_best_so_far_starts_afresh_for_each_task(child):
    assert isinstance(child.setup(f"{TASKS}:rises_until_cancelled"), TrainerReady)
    best = {}
    for task_id, epochs in ((20, 15), (21, 1)):
        child.send(Task(task_id, None))
        for _ in range(epochs):
            p = child.recv()
            assert isinstance(p, Progress) and p.id == task_id
        child.send(Cancel(task_id, Status.PRUNED))
        while not isinstance(msg := child.recv(), Outcome):
            assert msg.id == task_id
        assert msg.id == task_id and msg.status == Status.PRUNED
        best[task_id] = msg.fitness
    assert best[20] >= 1.5
    assert best[21] < 1.0  # not the first task's best carried over: its fitness restarts at 0.1


def test_stop_makes_the_child_exit_0(ready):
    _, out = ready.run(Task(1, {"fitness": 1.0}))
    assert out.status == Status.OK
    ready.send(Stop())
    assert ready.proc.wait(timeout=WAIT) == 0


def test_stop_right_after_setup_exits_0(ready):
    ready.send(Stop())
    assert ready.proc.wait(timeout=WAIT) == 0
