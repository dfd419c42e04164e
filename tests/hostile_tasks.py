"""Task functions for the hostile-user tests (tests/test_hostile.py): they take the real payload (an
evolve.train.TrainTask)."""
from __future__ import annotations

import time


def quick(task, ctx):
    """A fitness from the genome, one epoch reported, no weights: a cheap stand-in for training."""
    g = task.genome
    fitness = -abs(g.num_layers - 4) - abs(g.batch_size - 64) / 64
    ctx.report({"epoch": 1, "fitness": fitness})
    return {"fitness": fitness, "metrics": {"layers": g.num_layers}}


def slowish(task, ctx):
    """`quick`, slowed down so that signals find trainers in the middle of a task."""
    time.sleep(0.5)
    return quick(task, ctx)
