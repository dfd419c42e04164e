"""The payload of every task: what one network's training is given (a genome, the problem, the `[train]` table,
how the data is read), and how it travels. Free of torch, so that a worker rank, which only passes tasks to its
trainer child, unpickles them without importing torch (bench/first_task.py): the child trains
(evolve/train.py).
"""
from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass

from galapagos.datashare.stream import StreamSpec
from galapagos.evolve.check import count_params
from galapagos.evolve.drawn import Drawn
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.settings import Check, Table

__all__ = ["DEVICE_MODES", "MEMORY_FORMATS", "DataAccess", "TrainConfig", "TrainTask"]

#: how the training split reaches a GPU: auto (whole when it fits in half the free device memory), whole, batches
DEVICE_MODES = ("auto", "whole", "batches")
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")


@dataclass(frozen=True)
class TrainConfig(Table):
    """The `[train]` table: how every candidate is trained (the genome holds what evolves)."""

    section = "train"

    epochs: int = 6  # epochs each candidate trains (pruning may stop it sooner)
    max_train_samples: int = 0  # per epoch; 0 = the whole training split
    eval_batch_size: int = 1024  # samples per forward pass when scoring on val
    grad_clip: float = 5.0  # the gradient norm is clipped to this (0 = no clipping)
    holdout: float = 0.0  # the share of the validation split that trainings never see: an evolution run's final pick
    # re-scores its best networks there (galapagos/flows/final_pick.py); 0: none held back
    warmup: float = 0.15  # the share of the one-cycle schedule's steps whose learning rate rises to the genome's;
    # multi-fidelity ([evolution] rungs) makes the schedule span the last rung and this share of the first
    mixed_precision: bool = True  # on GPUs only
    builder: str = ""  # "module:function" making each network from its genome; "" = Galapagos's own (GenomeNet)
    inherited_epochs: int = 0  # epochs of a child that inherited at least half its parameters; 0 = epochs
    inherit_shrink: float = 0.5  # a child's inherited parameters start at this share of its parent's plus the rest
    # of a fresh initialisation's (evolve/inherit.py); 1 = the parent's as they are
    adaptive_shrink: bool = False  # each child's share follows its parent's fit: the parent's training loss over its
    # validation loss at its best epoch, from inherit_shrink up to 1 (a parent that does not fit its training split
    # better than the validation's passes its weights on as they are)
    memory_format: str = "auto"  # conv nets: "auto" (channels-last for 2D on GPUs), "channels_last", "contiguous"
    compile: bool = False  # torch.compile each candidate: pays only where training is long against the compile
    cuda_graphs: bool = True  # on CUDA GPUs: each full batch's forward and backward replayed as two CUDA graphs
    # (where compile is false: a compiled candidate takes the compiled module instead)

    choices = {"memory_format": MEMORY_FORMATS}

    def checks(self) -> list[Check]:
        return [("epochs", self.epochs >= 1, "at least 1"),
                ("max_train_samples", self.max_train_samples >= 0, "at least 0 (0 = the whole training split)"),
                ("eval_batch_size", self.eval_batch_size >= 1, "at least 1"),
                ("inherited_epochs", 0 <= self.inherited_epochs <= self.epochs, f"0 to epochs ({self.epochs})"),
                ("inherit_shrink", 0 < self.inherit_shrink <= 1, "a share above 0, up to 1 (as inherited)"),
                ("grad_clip", self.grad_clip >= 0, "at least 0"),
                ("warmup", 0 < self.warmup < 1, "a share between 0 and 1"),
                ("holdout", 0 <= self.holdout < 1, "a share from 0 (none) up to 1"),
                ("builder", not self.builder or ":" in self.builder, "module:function, or \"\""),
                self._compile_check()]

    def shrink_after(self, metrics: Mapping) -> float | None:
        """With `adaptive_shrink`, the share of a parent's weights its children start from, given the parent's
        metrics: its training loss over its validation loss (at its best epoch, as its weights were kept), to two
        places, from `inherit_shrink` up to 1. None without `adaptive_shrink`, or where a loss is missing or not
        positive (the child then takes `inherit_shrink`)."""
        if not self.adaptive_shrink:  # first: rank 0 asks of every result
            return None
        train, val = metrics.get("train_loss"), metrics.get("val_loss")
        if not isinstance(train, (int, float)) or not isinstance(val, (int, float)) or not (train > 0 and val > 0):
            return None
        return round(min(1.0, max(self.inherit_shrink, train / val)), 2)

    def _compile_check(self) -> Check:
        if not self.compile:
            return ("compile", True, "")
        import torch  # only where a config asks for compile: this module stays free of torch

        return ("compile", hasattr(torch, "compile"), f"false: torch {torch.__version__} has no torch.compile")


@dataclass(frozen=True)
class DataAccess:
    """How a trainer child reads the training split: streamed from a file (``stream``), or from the shared copy,
    moved whole to the device or gathered batch by batch (``device``)."""

    stream: StreamSpec | None = None
    device: str = "auto"


@dataclass(frozen=True)
class TrainTask:
    """One network to train: the payload of every task the master sends, from an evolution run or an ensemble
    build, and what a task function (`run.task`, by default evolve.train.train_task) receives. On rank 0 a draw
    (evolve/drawn.py) has no genome yet, only `drawn`: the worker that unpickles it draws the genome."""

    genome: Genome | None
    problem: Problem
    train: TrainConfig
    seed: int = 0
    save: str | None = None  # where the best epoch's weights go (a state_dict); None: not saved
    inherit: str | None = None  # a parent's weights file to start from where the layers match; None: fresh
    data: DataAccess | None = None  # how the training split is read (streamed, or batch by batch to a GPU)
    drawn: Drawn | None = None  # a genome its worker draws (evolve/drawn.py)
    # Training in parts (a rung of a multi-fidelity search), evolve/checkpoint.py. All None: all at once.
    until: int | None = None  # the last epoch this task trains (the schedule spans all epochs still); None: all
    resume: str | None = None  # a checkpoint to go on from, at its next epoch (no parent inherited then)
    checkpoint: str | None = None  # where the whole training state goes at `cooldown`'s epoch; None: nowhere
    cooldown: int | None = None  # the epoch after which the learning rate decays to zero by `until` (evolve/rungs.py:
    # warm-up, stable, decay); None: the one-cycle schedule over all epochs

    def __reduce__(self):
        # Pickled for every task rank 0 sends: the genome goes as its canonical JSON (made once, for its key), and
        # what every task of a run shares as bytes pickled once. Pickled whole, a task cost rank 0 19 us, the most
        # of any one step per task at whole-machine scale (bench/scale.py). A draw goes as its id. Training in
        # parts adds its four fields, and only where a task has one.
        parts = (self.until, self.resume, self.checkpoint, self.cooldown)
        parts = parts if parts != (None, None, None, None) else ()
        if self.genome is None:
            d = self.drawn
            return _unpickle_drawn, (d.cid, _shared_bytes(self.problem, self.train, self.data, d.space, d.seed),
                                     self.seed, self.save, self.inherit, *parts)
        return _unpickle_task, (self.genome.canonical(), _shared_bytes(self.problem, self.train, self.data),
                                self.seed, self.save, self.inherit, *parts)

    @property
    def echo(self) -> dict | None:
        """What its worker adds to the task's result for rank 0 (launch/protocol.py: Task): a drawn genome, with
        its key and canonical JSON made here (they travel in its pickle: rank 0 unpickles the genome in a fifth of
        the time it would parse it from JSON), and its parameter count (where a user's builder does not make the
        network: counting that would import torch on the worker rank)."""
        if self.drawn is None or self.genome is None:
            return None
        echo: dict = {"genome": self.genome}
        self.genome.key  # noqa: B018 - made now, and cached in the genome
        if not self.train.builder:
            echo["params"] = count_params(self.genome, self.problem)
        return echo


_shared: tuple = ((), b"")  # the objects last pickled together, and their bytes


def _shared_bytes(*parts) -> bytes:
    global _shared
    last = _shared[0]
    if not (len(last) == len(parts) and all(a is b for a, b in zip(last, parts))):
        _shared = (parts, pickle.dumps(parts, pickle.HIGHEST_PROTOCOL))
    return _shared[1]


def _unpickle_task(genome: str, shared: bytes, seed: int, save: str | None, inherit: str | None,
                   *parts: int | str | None) -> TrainTask:
    problem, train, data = pickle.loads(shared)
    return TrainTask(Genome.from_json(genome), problem, train, seed, save, inherit, data, None, *parts)


def _unpickle_drawn(cid: int, shared: bytes, seed: int, save: str | None, inherit: str | None,
                    *parts: int | str | None) -> TrainTask:
    problem, train, data, space, run_seed = pickle.loads(shared)
    drawn = Drawn(space, run_seed, cid)
    return TrainTask(drawn.genome(problem), problem, train, seed, save, inherit, data, drawn, *parts)
