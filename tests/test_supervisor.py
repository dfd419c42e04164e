"""The trainer child under its supervisor: every way a task can end becomes a Result, and the child comes back."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import galapagos.launch.supervisor as supervisor_mod
from galapagos.launch.protocol import Progress, Result, Status, Task

OK, PRUNED, FAILED, NAN, CRASHED, TIMEOUT = (Status.OK, Status.PRUNED, Status.FAILED, Status.NAN, Status.CRASHED,
                                            Status.TIMEOUT)
from galapagos.launch.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[1]


def wait_result(sup: Supervisor, timeout: float = 60.0) -> tuple[Result, list[Progress]]:
    progress = []
    end = time.time() + timeout
    while time.time() < end:
        for ev in sup.poll(0.05):
            if isinstance(ev, Result):
                return ev, progress
            progress.append(ev)
    pytest.fail("no result in time")


@pytest.fixture
def sup():
    s = Supervisor(1, "tests.faulty_tasks:faulty")
    yield s
    s.stop()


def quick_payload():
    return {"genome": {"layers": [], "optimizer": "adam", "lr": 0.001, "batch_size": 64, "weight_decay": 0.0,
                       "head": "avg"}}


@pytest.mark.parametrize("task_id, status, words", [
    (1, FAILED, "injected failure"),
    (2, NAN, "non-finite"),
    (3, CRASHED, "SIGSEGV"),
    (5, CRASHED, "SIGABRT"),
])
def test_fault_becomes_status_and_child_restarts(sup, task_id, status, words):
    sup.submit(Task(task_id, None, time_limit=30))
    result, _ = wait_result(sup)
    assert (result.id, result.status, result.fitness) == (task_id, status, None)
    assert words in result.error
    sup.submit(Task(100, {**quick_payload(), "quick": True}, time_limit=30))  # runs in a live child
    result, progress = wait_result(sup)
    assert result.status == OK and result.fitness is not None
    assert [p.metrics["epoch"] for p in progress] == [1, 2, 3]


def test_hang_past_time_limit_is_killed(sup):
    pid_before = None
    sup.submit(Task(4, None, time_limit=1.0))
    pid_before = sup.proc.pid
    t0 = time.time()
    result, _ = wait_result(sup)
    assert result.status == TIMEOUT and "time limit" in result.error
    assert 1.0 <= time.time() - t0 < 10
    assert sup.proc is None or sup.proc.pid != pid_before


def test_cancel_prunes_with_best_fitness_so_far():
    s = Supervisor(1, "tests.faulty_tasks:reporter")
    try:
        s.submit(Task(7, None))
        seen = []
        while len(seen) < 3:
            seen += [e for e in s.poll(0.05) if isinstance(e, Progress)]
        s.cancel(7, PRUNED)
        result, progress = wait_result(s)
        assert result.status == PRUNED
        assert result.fitness == max(p.metrics["fitness"] for p in seen + progress)
    finally:
        s.stop()


def test_cancel_ignored_is_killed_after_grace(monkeypatch):
    monkeypatch.setattr(supervisor_mod, "CANCEL_GRACE", 0.5)
    s = Supervisor(1, "tests.faulty_tasks:ignores_cancel")
    try:
        s.submit(Task(8, None))
        s.poll(0.5)
        s.cancel(8, "cancelled")
        result, _ = wait_result(s)
        assert result.status == "cancelled" and "did not stop" in result.error
    finally:
        s.stop()


def test_queued_task_cancelled_without_running():
    s = Supervisor(1, "tests.faulty_tasks:quick")
    try:
        s.submit(Task(1, quick_payload()))
        s.submit(Task(2, quick_payload()))
        events = s.cancel(2, "cancelled")
        assert [(e.id, e.status) for e in events] == [(2, "cancelled")]
        result, _ = wait_result(s)
        assert result.id == 1 and result.status == OK
    finally:
        s.stop()


def test_unimportable_task_function_fails_each_task_clearly():
    s = Supervisor(1, "no_such_module:fn")
    try:
        events = s.submit(Task(1, None))
        assert len(events) == 1 and events[0].status == FAILED
        assert "no_such_module" in events[0].error
    finally:
        s.stop()


def test_a_child_started_before_the_setup_runs_the_task_function_and_writes_to_the_log_it_names(tmp_path):
    s = Supervisor(1, "tests.faulty_tasks:quick")
    try:
        s.start()  # as a worker rank does before the job's setup comes: no log, a guessed task function
        log = tmp_path / "trainer-1.log"
        s.place("tests.faulty_tasks:noisy", log_path=log)
        s.submit(Task(7, None))
        result, _ = wait_result(s)
        assert result.status == OK and result.fitness == 1.0
        assert "noisy stdout 7" in log.read_text() and "noisy stderr 7" in log.read_text()
    finally:
        s.stop()


def test_a_child_placed_on_a_gpu_before_its_setup_starts_the_gpu_runtime_or_falls_back_to_the_cpu():
    """The device goes to a child started early as soon as it is placed (TrainerDevice, ahead of the setup that waits
    for the data): it starts the GPU's runtime then; where this torch cannot drive the GPU (a CPU build, or the GPUs
    hidden, as in this session: tests/conftest.py), the task trains on the CPU."""
    import torch

    s = Supervisor(1, "tests.faulty_tasks:device_state")
    try:
        s.start()
        s.place("tests.faulty_tasks:device_state", device="cuda:0")
        s.submit(Task(1, None))
        result, _ = wait_result(s)
        on_gpu = torch.cuda.is_available()
        assert result.status == OK and result.metrics == {"device": "cuda:0" if on_gpu else "cpu", "cuda_up": on_gpu}
    finally:
        s.stop()


def test_stop_while_a_task_runs_kills_the_child_promptly():
    s = Supervisor(1, "tests.faulty_tasks:ignores_cancel")
    s.submit(Task(9, None))
    s.poll(0.5)
    proc = s.proc
    s.cancel(9, "cancelled")  # the master's Cancel comes first; this child never reads it
    t0 = time.time()
    s.stop()
    assert time.time() - t0 < supervisor_mod.BUSY_STOP_WAIT + 1.0
    assert proc.poll() is not None and s.proc is None


def test_stop_when_idle_lets_the_child_exit_by_itself():
    s = Supervisor(1, "tests.faulty_tasks:quick")
    s.submit(Task(1, quick_payload()))
    result, _ = wait_result(s)
    proc = s.proc
    s.stop()
    assert result.status == OK and proc.returncode == 0  # it exited on Stop, not killed


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package on sys.path with its sources only, as torch in a GPU image that ships no bytecode: its __init__.py."""
    pkg = tmp_path / "site" / "uncompiledpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return pkg / "__init__.py"


def test_a_package_without_bytecode_the_children_may_not_write_is_named_with_the_fix(package):
    from galapagos.launch.supervisor import uncompiled

    why = uncompiled("uncompiledpkg", {"PYTHONDONTWRITEBYTECODE": "1"})
    assert why is not None and "PYTHONDONTWRITEBYTECODE is set" in why
    assert str(package.parent) in why and "compileall" in why and "PYTHONPYCACHEPREFIX" in why
    assert uncompiled("uncompiledpkg", {}) is None  # the first child writes it
    import py_compile

    py_compile.compile(str(package), doraise=True)  # where this Python (and so a child) looks for it
    assert uncompiled("uncompiledpkg", {"PYTHONDONTWRITEBYTECODE": "1"}) is None
    assert uncompiled("no_such_package_here", {"PYTHONDONTWRITEBYTECODE": "1"}) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only directory")
def test_a_package_whose_bytecode_cannot_be_written_is_named(package):
    from galapagos.launch.supervisor import uncompiled

    package.parent.chmod(0o555)
    try:
        why = uncompiled("uncompiledpkg", {})
    finally:
        package.parent.chmod(0o755)
    assert why is not None and f"{package.parent} cannot be written" in why


def test_the_bytecode_check_reads_the_environment_the_children_get(package, tmp_path):
    """In a fresh process whose PYTHONDONTWRITEBYTECODE and PYTHONPYCACHEPREFIX are the job's, as on rank 0."""
    code = "from galapagos.launch.supervisor import uncompiled; print(uncompiled('uncompiledpkg'))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package.parent.parent), str(REPO)]),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "PYTHONDONTWRITEBYTECODE is set" in out
    env.pop("PYTHONDONTWRITEBYTECODE")
    subprocess.run([sys.executable, "-c", "import uncompiledpkg"], env=env, check=True)  # caches it in the prefix
    assert not (package.parent / "__pycache__").exists()
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "None"
