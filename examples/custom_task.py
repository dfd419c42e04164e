"""Your own model family, or your own training code, under Galapagos: evolve the hyperparameters of a model you
wrote.

    galapagos evolve --data shapes.h5 --out runs/mine --evaluations 40 --set train.builder=galapagos.examples.custom_task:build
    galapagos evolve --data shapes.h5 --out runs/mine --evaluations 40 --set run.task=galapagos.examples.custom_task:train

A builder (`train.builder = "module:function"`, here `build`) only makes the network: `build(genome, problem)`
returns a torch module taking normalised inputs (N, *problem.sample_shape) to (N, problem.num_outputs) outputs
(logits, or regression outputs in normalised units). Galapagos wraps it in the normalisation every network of its
own carries and trains it with its own recipe (schedule, mixed precision, pruning, best epoch kept), so the best
network, ensembles, `predict` and `export` work as for its own networks; the builder must be importable wherever
they run.

Galapagos still evolves its genomes and schedules them over the workers; each worker's trainer child calls
`run.task` ("module:function", importable on every node) once per candidate, as `function(task, ctx)`:

- `task` (evolve.train.TrainTask): `task.genome` (layers, lr, batch_size, optimizer, weight_decay: read what your
  model needs from it), `task.problem` (sample_shape, task, num_outputs), `task.train` (epochs, ...), `task.seed`,
  `task.save` (where the built-in task keeps its network's weights; leave it alone for a model of your own).
- `ctx` (launch.trainer.TaskContext): `ctx.device` ("cpu", "cuda:N" or "xpu:N": this worker's), `ctx.threads`,
  `ctx.cache` (a dict that lives as long as the child: keep tensors across candidates), and
  `evolve.train.device_data(ctx)`, the node's shared train and val splits as tensors on the device, moved once.
- Progress and cancellation: call `ctx.report({"epoch": e, "fitness": f, ...})` after each epoch. The master's
  median pruning reads "fitness", and a cancel (pruned, the run stopping, a time limit) arrives as an exception
  raised inside `ctx.report`; let it through. A task that overruns `run.task_timeout` is killed.
- Return `{"fitness": float, "metrics": {...}}`: higher fitness is better; a non-finite one is recorded as `nan`.
  Raise to fail the candidate (recorded with its status; the child lives on). JSON-able metrics are journalled.

The evolution, the journal, pruning, resume and reports work as with the built-in task. The networks are yours:
`best/` keeps the best genome and its metrics, from which your code rebuilds and retrains the model (`predict`,
`export` and `ensemble` build Galapagos's own networks from genomes, not yours).
"""
from __future__ import annotations

import math

import torch

from galapagos.evolve.train import device_data


class ResidualMLP(torch.nn.Module):
    """The user's model family: a residual MLP whose depth, width and dropout come from the genome."""

    def __init__(self, inputs: int, outputs: int, depth: int, width: int, dropout: float):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(inputs, width))
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.LayerNorm(width), torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Dropout(dropout))
            for _ in range(depth))
        self.head = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def hyperparameters(genome) -> dict:
    """What this model takes from a Galapagos genome: one block per layer gene, the widest gene's width."""
    widths = [g.get("units") or g.get("channels") or 0 for g in genome.layers]
    drops = [g.get("rate") for g in genome.layers if g.get("rate") is not None]
    return {"depth": max(1, min(6, len(genome.layers))), "width": max(32, min(512, max(widths, default=64))),
            "dropout": max(drops, default=0.0)}


def build(genome, problem) -> torch.nn.Module:
    """The builder: this model family, sized by the genome (Galapagos normalises the inputs around it)."""
    return ResidualMLP(math.prod(problem.sample_shape), problem.num_outputs, **hyperparameters(genome))


def train(task, ctx) -> dict:
    if task.problem.task != "classification":
        raise ValueError("galapagos.examples.custom_task trains classifiers only")
    torch.manual_seed(task.seed)
    data = device_data(ctx)
    (xtr, ytr), (xva, yva) = data["train"], data["val"]
    hp = hyperparameters(task.genome)
    model = ResidualMLP(math.prod(task.problem.sample_shape), task.problem.num_outputs, **hp).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=task.genome.lr, weight_decay=task.genome.weight_decay)
    mean, std = xtr.float().mean(0, keepdim=True), xtr.float().std(0, keepdim=True).clamp_min(1e-6)
    best = -1.0
    for epoch in range(1, task.train.epochs + 1):
        model.train()
        for idx in torch.randperm(len(xtr), device=xtr.device).split(task.genome.batch_size):
            loss = torch.nn.functional.cross_entropy(model((xtr[idx].float() - mean) / std), ytr[idx].long())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model((xva.float() - mean) / std).argmax(1) == yva).float().mean().item()
        best = max(best, accuracy)
        ctx.report({"epoch": epoch, "fitness": accuracy, "loss": loss.item()})  # may raise: pruned or stopped
    return {"fitness": best, "metrics": {"val_accuracy": best, "model": "ResidualMLP",
                                         "params": sum(p.numel() for p in model.parameters()), **hp}}
