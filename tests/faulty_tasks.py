"""Task functions that fail on purpose, for the fault tests: chosen by the task id, the rest train for real."""
from __future__ import annotations

import os
import signal
import sys
import time

from galapagos.evolve.train import train_task

# task id -> what goes wrong (ids start at 0)
FAULTS = {1: "raise", 2: "nan", 3: "segfault", 4: "hang", 5: "abort"}


def faulty(payload, ctx):
    fault = FAULTS.get(ctx.task_id)
    if fault == "raise":
        raise RuntimeError("injected failure")
    if fault == "nan":
        return {"fitness": float("nan")}
    if fault == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "abort":
        os.abort()
    if fault == "hang":
        while True:
            time.sleep(1)
    if isinstance(payload, dict) and payload.get("quick"):
        return quick(payload, ctx)
    return train_task(payload, ctx)


def quick(payload, ctx):
    """A cheap stand-in for training: fitness from the genome, epochs reported, for runtime tests."""
    from galapagos.evolve.genome import Genome

    g = payload.genome if hasattr(payload, "genome") else Genome.from_json(payload["genome"])
    fitness = -abs(g.num_layers - 4) - abs(g.batch_size - 64) / 64
    for epoch in range(1, 4):
        ctx.report({"epoch": epoch, "fitness": fitness - (3 - epoch)})
    return {"fitness": fitness, "metrics": {"layers": g.num_layers}}


def slow_quick(payload, ctx):
    """`quick`, slowed down so that a test can kill the run while tasks are in flight."""
    time.sleep(0.3)
    return quick(payload, ctx)


def kills_its_rank(payload, ctx):
    """SIGKILLs the worker rank that runs it (this trainer child's parent), as the loss of its node would: MPICH then
    ends every rank of the job."""
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)


def reporter(payload, ctx):
    """Reports a rising fitness until cancelled."""
    for epoch in range(1, 10_000):
        ctx.report({"epoch": epoch, "fitness": float(epoch)})
        time.sleep(0.02)
    return {"fitness": 0.0}


def ignores_cancel(payload, ctx):
    time.sleep(3600)


def sleeper(payload, ctx):
    """Holds its worker for `payload` seconds without using the CPU."""
    time.sleep(payload)
    return {"fitness": 1.0}


def aborts_task_1(payload, ctx):
    """Task 1 (an ensemble's second member) aborts its trainer process; every other task trains for real."""
    if ctx.task_id == 1:
        os.abort()
    return train_task(payload, ctx)


def noisy(payload, ctx):
    """Writes a line to stdout and one to stderr: where a trainer child's output goes."""
    print(f"noisy stdout {ctx.task_id}", flush=True)
    print(f"noisy stderr {ctx.task_id}", file=sys.stderr, flush=True)
    return {"fitness": 1.0}


def device_state(payload, ctx):
    """The device a task was given and whether CUDA was up before the task touched anything (TrainerDevice)."""
    import torch

    return {"fitness": 1.0, "metrics": {"device": ctx.device, "cuda_up": torch.cuda.is_initialized()}}


def kills_one_rank(payload, ctx):
    """The first task to run (of a run whose GALAPAGOS_TEST_MARK file does not exist yet) SIGKILLs its worker rank
    and itself, as the death of that rank's node would; every other task is `slow_quick`."""
    try:
        os.close(os.open(os.environ["GALAPAGOS_TEST_MARK"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return slow_quick(payload, ctx)
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def noted(payload, ctx):
    """Notes its start and end in `payload["dir"]` (a file per task: id, start, end), holding its worker for
    `payload["seconds"]`: packing tests read the overlaps. A task whose id is in `payload["reporters"]` reports
    epochs until cancelled instead."""
    from pathlib import Path

    note = Path(payload["dir"]) / f"task-{ctx.task_id}"
    start = time.time()
    note.write_text(f"{ctx.task_id} {start} running {os.getpid()}\n")
    if ctx.task_id in payload.get("reporters", ()):
        reporter(payload, ctx)
    time.sleep(payload["seconds"])
    note.write_text(f"{ctx.task_id} {start} {time.time()} {os.getpid()}\n")
    return {"fitness": 1.0}


def oom_when_crowded(payload, ctx):
    """Raises torch.cuda.OutOfMemoryError (constructible without a GPU) while another task of the run is running,
    as a candidate that does not fit beside others would; alone it ends well, unless `payload["always"]`."""
    from pathlib import Path

    import torch

    here = Path(payload["dir"])
    note = here / f"running-{ctx.task_id}"
    note.touch()
    try:
        time.sleep(payload["seconds"])
        others = [p for p in here.glob("running-*") if p != note]
        if ctx.task_id == payload.get("victim") and (others or payload.get("always")):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    finally:
        note.unlink()
    return {"fitness": 1.0}


def noting(payload, ctx):
    """`slow_quick` (an evolve task), noting its start and end in $GALAPAGOS_TEST_NOTES (a file per task)."""
    from pathlib import Path

    start = time.time()
    out = slow_quick(payload, ctx)
    (Path(os.environ["GALAPAGOS_TEST_NOTES"]) / f"task-{ctx.task_id}").write_text(f"{start} {time.time()}\n")
    return out
