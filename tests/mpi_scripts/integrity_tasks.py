"""Cheap stand-ins for training that take the real payload (an evolve.train.TrainTask), for the run-integrity
tests: a fitness from the genome, one epoch reported, no weights saved."""
import time


def quick(task, ctx):
    g = task.genome
    fitness = -abs(g.num_layers - 4) - abs(g.batch_size - 64) / 64
    ctx.report({"epoch": 1, "fitness": fitness})
    return {"fitness": fitness, "metrics": {"layers": g.num_layers}}


def slow(task, ctx):
    """`quick`, slowed down so that a test can act while the run is live."""
    time.sleep(0.3)
    return quick(task, ctx)
