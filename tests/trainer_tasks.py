"""Small task functions for the trainer-child protocol tests (tests/test_trainer.py): no torch, instant."""
from __future__ import annotations

import os
import time


def scripted(payload, ctx):
    """Reports each fitness of payload["curve"] as an epoch, then returns payload["fitness"]."""
    for epoch, fit in enumerate(payload.get("curve", []), 1):
        ctx.report({"epoch": epoch, "fitness": fit})
    return {"fitness": payload["fitness"], "metrics": {"epochs": len(payload.get("curve", []))}}


def describe(payload, ctx):
    """What the task sees of its child: id, rank, device, threads, data, the cores it may run on."""
    ctx.report({"epoch": 1, "fitness": 0.0})
    return {"fitness": 1.0, "metrics": {"task_id": ctx.task_id, "rank": ctx.rank, "device": ctx.device,
                                        "threads": ctx.threads, "data": sorted(ctx.data),
                                        "cores": sorted(os.sched_getaffinity(0)), "pid": os.getpid()}}


def raises(payload, ctx):
    raise RuntimeError(f"injected failure {payload}")


def diverges(payload, ctx):
    ctx.report({"epoch": 1, "fitness": 0.5})
    raise FloatingPointError("loss became nan at step 7")


class StatusError(Exception):
    status = "oom"


def says_oom(payload, ctx):
    raise StatusError("CUDA out of memory (as the task says)")


def no_memory(payload, ctx):
    raise MemoryError("cannot allocate")


def returns_inf(payload, ctx):
    return {"fitness": float("inf")}


def returns_nothing(payload, ctx):
    return None


def rises_until_cancelled(payload, ctx):
    """Reports a rising fitness, one epoch every 20 ms, until cancelled (gives up after 60 s: the test fails)."""
    end = time.time() + 60
    epoch = 0
    while time.time() < end:
        epoch += 1
        ctx.report({"epoch": epoch, "fitness": epoch / 10})
        time.sleep(0.02)
    return {"fitness": -1.0}
