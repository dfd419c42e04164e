"""One candidate trained data-parallel over a torch.distributed group (run.spread, launch/spread.py).

Every process of the group runs train_candidate with the same seed, so it builds the same network and draws the
same global batches; each trains on its shard of every batch and the gradients are summed over the group, each
weighted by its shard's share of the batch: the step is the one-device step of the whole batch (the recipe, the
schedule and the epochs stay those of one device). The group agrees on everything that decides what happens next:
the loss checks sum over it, the leader (group rank 0) validates and broadcasts the metrics, and the leader alone
reports them, so a cancel stops every process at the same epoch. Without an initialised group of two or more,
every helper here leaves the one-device training as it was.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from galapagos.evolve.build import build_model
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.steps import sync

# Tensors an optimiser keeps per parameter: Adam's and AdamW's two moments, SGD's momentum buffer (evolve/train.py).
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 1}


class GroupStopped(Exception):
    """Raised in a follower when the group's leader stopped the candidate (cancelled or pruned by the master): the
    trainer records it as `cancelled`; the leader's own status is the task's."""

    status = "cancelled"


class Group:
    """This process's place in the candidate's group: `rank` of `size`; size 1 is the one-device training."""

    def __init__(self, rank: int = 0, size: int = 1):
        self.rank, self.size = rank, size
        self.part = 1.0  # this process's share of the current batch's rows

    @classmethod
    def current(cls) -> Group:
        """The initialised torch.distributed group, or the one-device training where there is none."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def leader(self) -> bool:
        """The process that reports, saves the weights and whose result is the task's."""
        return self.rank == 0

    def shard(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's contiguous rows of a global batch. A batch too small to give each at least two (batch
        norm needs two) is trained whole by every process, each counting for 1/size of it."""
        if self.size == 1:
            return xb, yb
        n = len(xb)
        if n < 2 * self.size:
            self.part = 1.0 / self.size
            return xb, yb
        lo, hi = self.rank * n // self.size, (self.rank + 1) * n // self.size
        self.part = (hi - lo) / n
        return xb[lo:hi], yb[lo:hi]

    def weighted(self, loss: torch.Tensor) -> torch.Tensor:
        """A shard's mean loss as its part of the global batch's mean: summed over the group, the batch's loss."""
        return loss if self.size == 1 else loss * self.part

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Each gradient made the global batch's: the shards' gradients weighted by their parts and summed over the
        group in one flat all_reduce (gradients still scaled by an fp16 loss scaler stay scaled alike)."""
        if self.size == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads).mul_(self.part)
        dist.all_reduce(flat)
        for grad, summed in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(summed)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over the group (a copy): the same number in every process, so all stop or none does."""
        if self.size == 1:
            return value
        total = value.clone()
        dist.all_reduce(total)
        return total

    def from_leader(self, model: torch.nn.Module, evaluate: Callable[[], dict]) -> dict:
        """The epoch's metrics, evaluated by the leader and broadcast, once the batch-norm running statistics are
        averaged over the group (each process saw its own shards; their mean is the statistics of the batches)."""
        if self.size == 1:
            return evaluate()
        stats = [b for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)
                 and m.track_running_stats for b in (m.running_mean, m.running_var)]
        if stats:
            flat = _flatten_dense_tensors(stats).div_(self.size)
            dist.all_reduce(flat)
            for b, mean in zip(stats, _unflatten_dense_tensors(flat, stats)):
                b.copy_(mean)
        return self._broadcast(evaluate() if self.leader else None)

    def report(self, report: Callable[[dict], None] | None, metrics: dict) -> None:
        """The leader reports the metrics (which may raise to stop the candidate); the followers stop with it."""
        if self.size == 1:
            if report is not None:
                report(metrics)
            return
        if not self.leader:
            if self._broadcast(None):
                raise GroupStopped("the group's leader stopped the candidate")
            return
        try:
            if report is not None:
                report(metrics)
        except BaseException:
            self._broadcast(True)
            raise
        self._broadcast(False)

    def _broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


@dataclass(frozen=True)
class Estimate:
    """Bytes one device holds to train a candidate on one batch (float32, before mixed precision halves some)."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int  # what autograd keeps for the backward of one batch

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations


def estimate_memory(genome: Genome, problem: Problem, batch: int, builder: str = "") -> Estimate:
    """The memory a candidate needs on one device, from its network built on the meta device (shapes, no data)
    and one forward pass of a batch there: the tensors autograd saves for the backward are the activations."""
    model = build_model(genome, problem, "meta", builder=builder)
    params = list(model.parameters())
    owned = {id(p) for p in params}
    saved: dict[int, torch.Tensor] = {}  # held, so that no id is reused while counting

    def keep(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in owned:
            saved[id(t)] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.empty(batch, *problem.sample_shape, device="meta"))
    size = sum(p.numel() * p.element_size() for p in params)
    return Estimate(size, size, OPTIMIZER_STATES.get(genome.optimizer, 2) * size,
                    sum(t.numel() * t.element_size() for t in saved.values()))


def step_seconds(genome: Genome, problem: Problem, device: str, builder: str = "", steps: int = 3) -> float:
    """Seconds one training step of a batch takes on `device`, timed over `steps` steps on random data after an
    untimed one: what run.spread = "auto" projects a candidate's training time from. Plain float32 steps, without the
    trainer's mixed precision and CUDA graphs: if anything, slower than the training."""
    dev = torch.device(device)
    model = build_model(genome, problem, dev, builder=builder)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(genome.batch_size, *problem.sample_shape, device=dev)

    def step() -> None:
        loss = model(x).float().pow(2).mean()  # any scalar: its backward is a step's work
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    sync(dev)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    return (time.perf_counter() - start) / steps
