"""Training one candidate network: the task a worker's trainer child runs for every genome.

The dataset is moved to the device once per trainer child (ctx.cache) and batches are cut from it there, so
a candidate costs no host-to-device copies beyond the first. On GPUs it trains in mixed precision (bf16 where
the device has it, else fp16 with loss scaling).
"""
from __future__ import annotations

import gc
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from galapagos.datashare.carve import holdout_indices
from galapagos.datashare.plan import split_arrays
from galapagos.evolve.batches import (batch_data, batches_per_epoch, child_device, epoch_batches, resident_fits,
                                      stats_sample)
from galapagos.evolve.build import build_model, set_normalization
from galapagos.evolve.checkpoint import load_checkpoint, restore, save_checkpoint, training_state
from galapagos.evolve.dense import class_counts, evaluate_dense, field_loss, segmentation_loss
from galapagos.evolve.distributed import Group
from galapagos.evolve.genome import Genome
from galapagos.evolve.inherit import inherit_weights
from galapagos.evolve.netdir import save_weights
from galapagos.evolve.normalize import normalization_stats
from galapagos.evolve.problem import Problem
from galapagos.evolve.steps import autocast_for, evaluate, graphed, latency_ms, memory_format, sync, to_memory_format
from galapagos.evolve.task import DataAccess, TrainConfig, TrainTask

log = logging.getLogger(__name__)


class NonFiniteLoss(FloatingPointError):
    """The loss became NaN or infinite: the candidate diverged (the trainer records it as status `nan`)."""


# Batches between looks at the summed training loss. Each look waits for the device (a host sync); once a batch,
# it kept the CPU from queueing work ahead of a GPU. A diverged candidate is caught at most this many batches late.
FINITE_EVERY = 64


def _check_finite(total: torch.Tensor, epoch: int, batches: int) -> None:
    if not torch.isfinite(total):
        raise NonFiniteLoss(f"training loss is {total.item()} by epoch {epoch}, batch {batches}")


def _optimizer(genome: Genome, params, device: torch.device) -> torch.optim.Optimizer:
    """The genome's optimiser; on CUDA devices the fused kernels (one launch per step for all parameters:
    https://docs.pytorch.org/docs/stable/optim.html, "fused")."""
    fused = {"fused": True} if device.type == "cuda" else {}
    if genome.optimizer == "sgd":
        return torch.optim.SGD(params, lr=genome.lr, momentum=0.9, nesterov=True, weight_decay=genome.weight_decay,
                               **fused)
    cls = torch.optim.AdamW if genome.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=genome.lr, weight_decay=genome.weight_decay, **fused)



def _on(device: torch.device, a: Any) -> Any:
    """A tensor on `device`, moved once if it is elsewhere (a caller's arrays on the CPU for a GPU candidate); row
    views and host-side batch sources (`Rows`, evolve/batches.py) keep where they are."""
    return a.to(device) if isinstance(a, torch.Tensor) and a.device != device else a


def _prepared_model(genome: Genome, problem: Problem, config: TrainConfig, device: torch.device, xtr: torch.Tensor,
                    ytr: torch.Tensor, stats: dict | None, parent: dict | None) -> tuple:
    """The genome's network with its normalization statistics and a parent's weights where the layers match, on
    `device` in its memory format: (the network, its compiled module or None, the share inherited or None, the
    memory format or None)."""
    model = build_model(genome, problem, builder=config.builder)
    set_normalization(model, **(stats or normalization_stats(xtr, ytr, problem.task)))
    inherited = inherit_weights(model, parent, config.inherit_shrink) if parent else None
    model.to(device)
    if (fmt := memory_format(model, device, config.memory_format)) is not None:
        to_memory_format(model, fmt)
    # torch.compile (https://docs.pytorch.org/docs/stable/generated/torch.compile.html) compiles at the first step:
    # seconds that pay back only over many steps. Full batches take the compiled module; the last, shorter batch of
    # an epoch and the evaluation take the module itself (same parameters), so no shape or mode compiles again.
    compiled = torch.compile(model) if config.compile else None
    return model, compiled, inherited, fmt


def _schedule(genome: Genome, config: TrainConfig, opt: torch.optim.Optimizer, rows: int, inherited: float | None,
              resumed: dict | None = None, cooldown: int | None = None, until: int | None = None
              ) -> tuple[int, int, int, torch.optim.lr_scheduler.LRScheduler]:
    """How long the candidate trains: (training rows per epoch, epochs, steps, the learning rate over them). A network
    that inherited most of its weights may train fewer epochs (`inherited_epochs`); a resumed one keeps the epochs of
    its first task (its checkpoint's), so that its schedule goes on, never restarts. The learning rate is one cycle
    over all epochs, or with `cooldown` (a rung of a multi-fidelity search) warm-up, stable, decay: it rises over the
    warm-up, stays at the genome's, and decays to zero from the end of epoch `cooldown` to the end of `until`."""
    n = rows if not config.max_train_samples else min(rows, config.max_train_samples)
    epochs = config.inherited_epochs if inherited is not None and inherited >= 0.5 and config.inherited_epochs \
        else config.epochs
    if resumed is not None:
        epochs = resumed["epochs"]
    if cooldown is None:
        steps = max(1, n // genome.batch_size) * epochs
        return n, epochs, steps, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=genome.lr, total_steps=steps,
                                                                     pct_start=config.warmup)
    per_epoch = batches_per_epoch(n, genome.batch_size)
    steps = max(1, per_epoch) * epochs
    warm, decay, end = max(1, round(config.warmup * steps)), cooldown * per_epoch, (until or epochs) * per_epoch

    def factor(step: int) -> float:
        if step >= decay:
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - decay + 0.5) / max(1, end - decay))))
        return min(1.0, (1 + step) / warm)

    return n, epochs, steps, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _loss_function(genome: Genome, problem: Problem, model: torch.nn.Module, ytr: torch.Tensor,
                   counts: torch.Tensor | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The training loss of a batch's output and targets, by task: cross-entropy, MSE on targets normalised per
    target (regression) or per channel (field), the genome's segmentation loss."""
    if problem.task == "classification":
        return lambda out, yb: F.cross_entropy(out.float(), yb)
    if problem.task == "regression":
        y_mean, y_std = model.y_mean, model.y_std
        return lambda out, yb: F.mse_loss((out.float() - y_mean) / y_std, (yb - y_mean) / y_std)
    if problem.task == "field":
        return field_loss(model.y_mean, model.y_std)
    if counts is None and genome.loss == "weighted_ce":
        counts = class_counts(ytr, problem.num_outputs, problem.ignore_index)
    return segmentation_loss(genome.loss, counts, problem.ignore_index)


def _step(opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, params: list, grad_clip: float,
          sched: torch.optim.lr_scheduler.LRScheduler, steps: int) -> None:
    """The optimizer's step after a batch's backward: gradients unscaled (fp16) and clipped, step, schedule. It
    takes no loss: a failed step's frame, kept by the traceback, must not hold the CUDA graphs (train_candidate)."""
    if scaler is not None:
        scaler.unscale_(opt)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    if sched.last_epoch + 1 < steps:
        sched.step()


def _how_trained(inherited: float | None, config: TrainConfig, amp_dtype: torch.dtype | None,
                 fmt: torch.memory_format | None, compile_seconds: float | None, graphs: bool,
                 captured: bool | None) -> dict:
    """The summary's notes on how the candidate trained, each where it applies (`shrink`: the share of its parent's
    weights it started from, where the share follows the parent's fit)."""
    notes: dict = {}
    if inherited is not None:
        notes["inherited"] = round(inherited, 4)
        if config.adaptive_shrink:
            notes["shrink"] = config.inherit_shrink
    if amp_dtype is not None:
        notes["precision"] = str(amp_dtype).replace("torch.", "")
    if fmt is not None:
        notes["memory_format"] = str(fmt).replace("torch.", "")
    if compile_seconds is not None:
        notes["compile_seconds"] = round(compile_seconds, 3)
    if graphs:
        notes["cuda_graphs"] = bool(captured)  # False: the capture failed (logged), or no batch was full
    return notes


def _validated(model: torch.nn.Module, data: tuple, problem: Problem, config: TrainConfig, autocast: Callable,
               group: Group, epoch: int, total: torch.Tensor, batches: int) -> dict:
    """The epoch's metrics: its mean training loss and the validation's (the leader's, for a group), both finite."""
    total = group.sum(total)
    _check_finite(total, epoch, batches)
    xva, yva = data
    metrics = {"epoch": epoch, "train_loss": total.item() / max(batches, 1), **group.from_leader(model, lambda:
               evaluate_dense(model, xva, yva, problem, config.eval_batch_size, autocast) if problem.is_dense
               else evaluate(model, xva, yva, problem.task, config.eval_batch_size, autocast))}
    if not math.isfinite(metrics["fitness"]):
        raise NonFiniteLoss(f"validation score is {metrics['fitness']} at epoch {epoch}")
    return metrics


def _summary(best: dict, epochs: int, trained: int | None, seconds: float, params: list, latency: float,
             notes: dict) -> dict:
    """What the candidate's result says: its best epoch's score and metrics, over every epoch trained so far (by
    earlier tasks too, for a resumed one), its planned `epochs` and, where a task trained part of them or went on
    from a checkpoint, the epochs trained by its end (`epochs_trained`)."""
    return {"fitness": best["fitness"], "best_epoch": best["epoch"], "epochs": epochs,
            **({"epochs_trained": trained} if trained is not None else {}),
            "train_seconds": seconds,
            "params": sum(p.numel() for p in params),
            "latency_ms": latency,
            **{k: v for k, v in best.items() if k not in ("epoch", "fitness")},
            **notes}


def _copied(model: torch.nn.Module) -> dict:
    """The best epoch's weights, copied on the device (no wait; to the CPU at the end)."""
    return {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in model.state_dict().items()}


def _last_epoch(start: int, epochs: int, until: int | None, resume: str | Path | None,
                cooldown: int | None) -> tuple[int, int]:
    """The epoch this task trains to (`until`, within the schedule's epochs, and past the checkpoint's `start`) and
    the one whose state is its checkpoint: `cooldown`, after which its decay starts, between the two, or the last."""
    last = epochs if until is None else min(until, epochs)
    if last <= start:
        where = f" (resumed from {resume} at epoch {start} of {epochs})" if resume is not None else ""
        raise ValueError(f"nothing to train: until = {until}{where}")
    if cooldown is not None and not start < cooldown < last:
        raise ValueError(f"cooldown = {cooldown}: not between the epoch this task starts after ({start}) and its last "
                         f"({last})")
    return last, last if cooldown is None else cooldown


def train_candidate(genome: Genome, problem: Problem, data: dict[str, tuple[torch.Tensor, torch.Tensor]],
                    config: TrainConfig, *, device: str | torch.device = "cpu", seed: int = 0,
                    report: Callable[[dict], None] | None = None, stats: dict | None = None,
                    parent: dict | None = None, counts: torch.Tensor | None = None, until: int | None = None,
                    resume: str | Path | None = None, checkpoint: str | Path | None = None,
                    cooldown: int | None = None, keep_last: bool = False) -> tuple[dict, dict]:
    """Train `genome` on data['train'], score it on data['val'] after every epoch; keep the best epoch.

    Returns (summary, state_dict of the best epoch). `report` gets each epoch's metrics (it may raise to stop).
    `parent`: a parent's state_dict, inherited where the layers match (evolve/inherit.py). `counts`: the
    training split's pixels per class (segmentation's weighted_ce; counted here when not given). `until`: the last
    epoch to train (None: all; the schedule spans all of them still). `cooldown`: the epoch after which the learning
    rate decays to zero by `until` (a rung of evolve/rungs.py; None: one cycle over all epochs). `checkpoint`: where
    the whole training state goes at the end of epoch `cooldown` (of `until` without one); `resume`: such a file
    (evolve/checkpoint.py) to go on from, at its next epoch, with its schedule and best epoch so far (a parent is
    inherited only at a fresh start). `keep_last`: keep the last epoch (a refit, whose val is in its training).
    """
    device, group = torch.device(device), Group.current()  # group: the processes it is spread over (run.spread)
    torch.manual_seed(seed)
    resumed = load_checkpoint(resume) if resume is not None else None  # every process of a group reads it
    xtr, ytr = (_on(device, a) for a in data["train"])
    xva, yva = (_on(device, a) for a in data["val"])
    model, compiled, inherited, fmt = _prepared_model(genome, problem, config, device, xtr, ytr, stats,
                                                      parent if resumed is None else None)
    graphs = config.cuda_graphs and not config.compile and device.type == "cuda"  # captured at the first full batch
    fast, captured, compile_seconds = compiled, None, None  # full batches' module; the capture took? (None: untried)
    amp_dtype, autocast = autocast_for(device, config.mixed_precision)
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    params = list(model.parameters())  # once: walking the modules was a quarter of the clipping's host time per step
    opt = _optimizer(genome, params, device)
    n, epochs, steps, sched = _schedule(genome, config, opt, xtr.shape[0], inherited, resumed, cooldown, until)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    loss_of = _loss_function(genome, problem, model, ytr, counts)
    start, best, best_state, inherited = (0, None, {}, inherited) if resumed is None else \
        restore(resumed, resume, model, opt, sched, scaler, gen, steps)
    last, at = _last_epoch(start, epochs, until, resume, cooldown)
    t0 = time.perf_counter()
    # the batch loop stays here: `finally` drops what holds the CUDA graphs, which a helper's frame would keep
    try:
        for epoch in range(start + 1, last + 1):
            model.train()
            total, batches = torch.zeros((), device=device), 0  # summed on the device: no host sync per batch
            for xb, yb in epoch_batches(xtr, ytr, n, genome.batch_size, gen, device, genome.shift):
                full = len(xb) == genome.batch_size
                xb, yb = group.shard(xb, yb)
                if graphs and full and captured is None:
                    fast = graphed(model, xb, amp_dtype)
                    captured = fast is not None
                with autocast():
                    out = (fast if fast is not None and full else model)(xb)
                    loss = loss_of(out, yb)
                opt.zero_grad(set_to_none=True)
                (scaler.scale(loss) if scaler is not None else loss).backward()
                group.reduce_gradients(params)
                _step(opt, scaler, params, config.grad_clip, sched, steps)
                total += group.weighted(loss.detach())
                batches += 1
                if compiled is not None and compile_seconds is None:
                    sync(device)
                    compile_seconds = time.perf_counter() - t0  # the first step, the compile in it
                if batches % FINITE_EVERY == 0:
                    _check_finite(group.sum(total), epoch, batches)
            metrics = _validated(model, (xva, yva), problem, config, autocast, group, epoch, total, batches)
            if best is None or keep_last or metrics["fitness"] > best["fitness"]:
                best, best_state = dict(metrics), _copied(model)
            group.report(report, metrics)
            if checkpoint is not None and epoch == at and group.leader:
                save_checkpoint(checkpoint, training_state(epoch, epochs, steps, model, opt, sched, scaler, gen, best,
                                                           best_state, inherited))
    finally:
        if captured:  # the graphs and their memory pool sit in reference cycles (a class made per capture), which
            fast = out = loss = None  # only a collection frees, once nothing holds them: now, finished or not
            gc.collect()
            # and cuBLAS keeps a workspace per stream, the capture's from the graphs' pool, which it would hold for
            # good: dropped, as torch's own CUDA graph trees do (torch/_inductor/cudagraph_trees.py)
            getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
    summary = _summary(best, epochs, last if until is not None or resumed is not None else None,
                       time.perf_counter() - t0, params, latency_ms(model, xva, device, autocast),
                       _how_trained(inherited, config, amp_dtype, fmt, compile_seconds, graphs, captured))
    return summary, {k: v.to("cpu") for k, v in best_state.items()}


class Rows:
    """The rows ``index`` of a tensor, gathered batch by batch: a split carved from the shared data, not copied."""

    def __init__(self, data: torch.Tensor, index: torch.Tensor):
        self.data, self.index = data, index

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.index), *self.data.shape[1:])

    @property
    def device(self) -> torch.device:
        return self.data.device

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, rows) -> torch.Tensor:
        return self.data[self.index[rows]]


def device_data(ctx: Any, splits: tuple[str, ...] = ("train", "val"), access: DataAccess = DataAccess(),
                holdout: float = 0.0) -> dict:
    """The shared arrays as tensors on this child's device, made once and kept for every later task. A training
    split streamed from its file, or too big for the device, comes through evolve/batches.py instead. `holdout`:
    the share of the validation rows left out (`[train] holdout`)."""
    if "tensors" not in ctx.cache and (access.stream is not None or not resident_fits(ctx, splits, access)):
        ctx.cache["tensors"] = batch_data(ctx, splits, access)
    if "tensors" not in ctx.cache:
        device = child_device(ctx)
        moved: dict[int, torch.Tensor] = {}  # each shared array goes to the device once, though two splits use it

        def to_device(array):
            if id(array) not in moved:  # on the CPU: a view of the node's shared memory, no copy
                moved[id(array)] = torch.from_numpy(array).to(device)
            return moved[id(array)]

        tensors = {}
        for split, a in split_arrays(ctx.data, splits).items():
            if a.index is None:
                tensors[split] = (to_device(a.x), to_device(a.y))
            else:  # carved from the file's train split: its rows, gathered batch by batch
                index = torch.from_numpy(a.index).to(device)
                tensors[split] = (Rows(to_device(a.x), index), to_device(a.y).index_select(0, index))
        ctx.cache["tensors"] = tensors
    if holdout and "val" in splits and not ctx.cache.get("held_back"):
        ctx.cache["tensors"]["val"] = _search_rows(*ctx.cache["tensors"]["val"], holdout)
        ctx.cache["held_back"] = True
    return ctx.cache["tensors"]


def _search_rows(x: Any, y: torch.Tensor, holdout: float) -> tuple[Any, torch.Tensor]:
    """The validation rows trainings score on, without those held back for the final pick."""
    keep = torch.from_numpy(holdout_indices(len(y), holdout)[0]).to(y.device)
    x = Rows(x.data, x.index.index_select(0, keep)) if isinstance(x, Rows) else x.index_select(0, keep)
    return x, y.index_select(0, keep)


def _parent(path: str | None) -> dict | None:
    """The parent's weights, or None when there are none to inherit: the master may have pruned the file since it
    sent the task (the child then trains from scratch, as a random genome does)."""
    if path is None:
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - gone, or cut short: torch fails in many ways; none stops the child
        log.info("not inheriting %s: %s", path, exc)
        return None


def train_task(task: TrainTask, ctx: Any) -> dict:
    """The default task function: train, save the best epoch's weights, return {"fitness", "metrics"}. A task with
    `until`, `resume` or `checkpoint` trains a part of its candidate's epochs (train_candidate)."""
    data = device_data(ctx, access=task.data or DataAccess(), holdout=task.train.holdout)
    problem = task.problem
    key = ("stats", problem.task)
    ckey = (("counts", problem.num_outputs, problem.ignore_index)  # segmentation's weighted_ce: pixels per class
            if problem.task == "segmentation" and task.genome.loss == "weighted_ce" else None)
    if key not in ctx.cache or (ckey is not None and ckey not in ctx.cache):
        xs, ys = stats_sample(*data["train"])  # once per trainer child (a streamed split: read from the file)
        if key not in ctx.cache:
            ctx.cache[key] = normalization_stats(xs, ys, problem.task)
        if ckey is not None and ckey not in ctx.cache:
            ctx.cache[ckey] = class_counts(ys, problem.num_outputs, problem.ignore_index)
    counts = None if ckey is None else ctx.cache[ckey]
    summary, state = train_candidate(task.genome, task.problem, data, task.train, device=ctx.device, seed=task.seed,
                                     report=ctx.report, stats=ctx.cache[key], counts=counts, until=task.until,
                                     parent=_parent(task.inherit) if task.resume is None else None,  # fresh only
                                     resume=task.resume, checkpoint=task.checkpoint, cooldown=task.cooldown)
    if task.save and Group.current().leader:  # spread: the group's leader writes the weights
        save_weights(state, task.save)
    return {"fitness": summary.pop("fitness"), "metrics": summary}
