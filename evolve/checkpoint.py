"""A candidate's whole training state at the end of an epoch, in a file, so that a later task continues its training
where an earlier one stopped: a search that trains in rungs of increasing length (epochs 1-2 for all, 3-6 for the
best) resumes each survivor with its optimizer's moments, its learning rate schedule (which never restarts) and its
batch order going on as if it had never stopped (evolve/train.py writes and reads it).

One torch.save file (a dict), written atomically, the one owner of the format:

```
format, version        "galapagos-training-checkpoint", 1
epoch                  the last epoch trained
epochs, steps          the schedule it is part of: its epochs and optimizer steps in all
model, optimizer, scheduler, scaler    their state_dicts (scaler: None without fp16 loss scaling)
generator, rng, device_rng             the batch order's generator, the global CPU generator and the device's
                                       (dropout; None on a CPU)
best, best_state       the best epoch so far: its metrics and its weights
inherited              the share of parameters inherited from a parent at the start, or None
```
"""
from __future__ import annotations

from pathlib import Path

import torch

from galapagos.evolve.batches import GPU_TYPES
from galapagos.evolve.netdir import save_weights

__all__ = ["CheckpointError", "load_checkpoint", "restore", "save_checkpoint", "training_state"]

FORMAT, VERSION = "galapagos-training-checkpoint", 1
KEYS = ("epoch", "epochs", "steps", "model", "optimizer", "scheduler", "scaler", "generator", "rng", "device_rng",
        "best", "best_state", "inherited")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable or not this candidate's; the message names the file."""


def _first_line(exc: Exception) -> str:
    """An error as its type and the first line of its message (torch's run to many lines)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def _device_rng(device: torch.device) -> torch.Tensor | None:
    return getattr(torch, device.type).get_rng_state(device) if device.type in GPU_TYPES else None


def training_state(epoch: int, epochs: int, steps: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                   sched: torch.optim.lr_scheduler.LRScheduler, scaler: torch.amp.GradScaler | None,
                   gen: torch.Generator, best: dict, best_state: dict, inherited: float | None) -> dict:
    """What `save_checkpoint` writes, taken at the end of `epoch`."""
    device = next(iter(model.state_dict().values())).device
    return {"epoch": epoch, "epochs": epochs, "steps": steps,
            "model": {k: v.detach().to("cpu", memory_format=torch.contiguous_format)
                      for k, v in model.state_dict().items()},
            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "generator": gen.get_state(), "rng": torch.get_rng_state(), "device_rng": _device_rng(device),
            "best": dict(best), "best_state": {k: v.to("cpu") for k, v in best_state.items()},
            "inherited": inherited}


def save_checkpoint(path: str | Path, state: dict) -> None:
    """`state` (training_state's) to `path`, atomically: a reader sees the old file or the whole new one."""
    save_weights({"format": FORMAT, "version": VERSION, **state}, path)


def load_checkpoint(path: str | Path) -> dict:
    """The training state in `path`, on the CPU; a CheckpointError naming the file where there is none."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"cannot resume from {path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - cut short, garbled, not torch's: torch fails in many ways
        raise CheckpointError(f"cannot resume from {path}: not a readable checkpoint ({_first_line(exc)})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"cannot resume from {path}: not a training checkpoint (no format {FORMAT!r})")
    if state.get("version") != VERSION:
        raise CheckpointError(f"cannot resume from {path}: checkpoint version {state.get('version')!r}, "
                              f"this Galapagos reads {VERSION}")
    if missing := [k for k in KEYS if k not in state]:
        raise CheckpointError(f"cannot resume from {path}: a training checkpoint without {', '.join(missing)}")
    return state


def restore(state: dict, path: str | Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
            sched: torch.optim.lr_scheduler.LRScheduler, scaler: torch.amp.GradScaler | None,
            gen: torch.Generator, steps: int) -> tuple[int, dict, dict, float | None]:
    """Put `state` (load_checkpoint's) into a freshly made candidate whose schedule has `steps` steps: (the epoch it
    reached, the best epoch's metrics and weights, the share it inherited at its start)."""
    if state["steps"] != steps:
        raise CheckpointError(f"cannot resume from {path}: its schedule has {state['steps']} steps over "
                              f"{state['epochs']} epochs, this task's {steps} (another genome, data or [train])")
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        if isinstance(sched, torch.optim.lr_scheduler.LambdaLR):  # a rate that is a function of the step: this
            for group, base, factor in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas):  # task's function's
                group["lr"] = base * factor(sched.last_epoch)  # (a rung's decay), not the one the checkpoint began
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        gen.set_state(state["generator"])
        torch.set_rng_state(state["rng"])
        device = next(iter(model.state_dict().values())).device
        if state["device_rng"] is not None and device.type in GPU_TYPES:
            getattr(torch, device.type).set_rng_state(state["device_rng"], device)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"cannot resume from {path}: it is not this candidate's ({_first_line(exc)})") from exc
    return state["epoch"], dict(state["best"]), state["best_state"], state["inherited"]
