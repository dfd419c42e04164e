"""What a candidate's training does besides its steps: the validation score, the latency, the precision, the memory
format, the CUDA graphs of a full batch (evolve/train.py trains with them)."""
from __future__ import annotations

import logging
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from galapagos.evolve.batches import GPU_TYPES

log = logging.getLogger(__name__)


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str, batch: int,
             autocast: Callable) -> dict:
    """Validation metrics and the fitness (accuracy, or mean R^2 for regression; higher is better)."""
    model.eval()
    outs = []
    with torch.no_grad(), autocast():
        for i in range(0, x.shape[0], batch):
            outs.append(model(x[i:i + batch]).float())
    out = torch.cat(outs)
    if task == "classification":
        nll = F.cross_entropy(out, y).item()
        acc = (out.argmax(1) == y).float().mean().item()
        return {"val_loss": nll, "val_accuracy": acc, "fitness": acc}
    err = out - y
    mse = (err * err).mean(0)
    var = y.var(0, unbiased=False).clamp_min(1e-12)
    r2 = 1 - mse / var
    return {"val_loss": (mse / var).mean().item(), "val_mse": mse.mean().item(), "val_r2": r2.mean().item(),
            "fitness": r2.mean().item()}


# Forward passes of one sample timed for a candidate's latency (after two untimed ones); the median is kept. A slow
# network stops after 3 timed passes once they took LATENCY_SECONDS: its median is steady sooner (on a CPU the 12
# passes of bench/train.py's 3D network took 0.4 s, 7% of its short candidate).
LATENCY_RUNS = 10
LATENCY_SECONDS = 0.03


@torch.inference_mode()
def latency_ms(model: torch.nn.Module, x: torch.Tensor, device: torch.device, autocast) -> float:
    """Milliseconds for one sample's forward pass on `device`, in eval mode and the training's precision: what the
    objective `latency` minimises (evolve/pareto.py)."""
    model.eval()
    sample, times = x[0:1], []
    with autocast():
        for _ in range(LATENCY_RUNS + 2):
            sync(device)
            t0 = time.perf_counter()
            model(sample)
            sync(device)
            times.append(time.perf_counter() - t0)
            if len(times) >= 5 and sum(times[2:]) >= LATENCY_SECONDS:
                break
    return 1000 * statistics.median(times[2:])


def autocast_for(device: torch.device, enabled: bool):
    """The mixed precision of a GPU (bf16 where it has it, else fp16) and its autocast; (None, a disabled one)
    elsewhere."""
    if device.type in GPU_TYPES and enabled:
        bf16 = getattr(getattr(torch, device.type), "is_bf16_supported", lambda: device.type == "xpu")()
        dtype = torch.bfloat16 if bf16 else torch.float16
        return dtype, (lambda: torch.autocast(device.type, dtype=dtype))
    return None, (lambda: torch.autocast(device.type, enabled=False))


def memory_format(model: torch.nn.Module, device: torch.device, setting: str) -> torch.memory_format | None:
    """Channels-last for a network with 2D or 3D convolutions where `setting` asks for it; None keeps the contiguous
    layout (1D and tabular networks have no channels-last format).
    https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html
    "auto": 2D networks on GPUs, whose convolution kernels run faster in it (tensor cores under mixed precision).
    3D networks stay contiguous: on an H100 (bf16, bench/train.py's 3D case) channels_last_3d trained 13% slower
    than the contiguous layout. CPUs keep the contiguous layout, which is as fast there."""
    if setting == "contiguous" or (setting == "auto" and device.type not in GPU_TYPES):
        return None
    dims = {m.weight.dim() for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))}
    if 5 in dims:
        return torch.channels_last_3d if setting == "channels_last" else None
    return torch.channels_last if 4 in dims else None


def to_memory_format(model: torch.nn.Module, fmt: torch.memory_format) -> None:
    """The tutorial's recipe: parameters (Module.to converts the 4D/5D ones) and every input in `fmt`; layers then
    keep it (https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html)."""
    model.to(memory_format=fmt)
    model.register_forward_pre_hook(lambda _, args: (args[0].contiguous(memory_format=fmt), *args[1:]))


class _Network(torch.nn.Module):
    """The network inside one more module, for make_graphed_callables: it refuses a module with hooks (the
    channels-last one) and replaces the forward of the module it is given, and the network's own must stay eager
    for the last, shorter batch of an epoch and for the validation."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def graphed(model: torch.nn.Module, sample: torch.Tensor, amp_dtype: torch.dtype | None) -> Callable | None:
    """`model`'s forward and backward on batches shaped as `sample`, each replayed as one CUDA graph
    (torch.cuda.make_graphed_callables, https://docs.pytorch.org/docs/stable/notes/cuda.html#partial-network-capture):
    a few kernel launches per step where the network's own take one per operation, so that the host no longer
    paces a small network's steps. The loss, clipping and optimizer step stay eager, so the schedule's learning rate
    and momentum act as in an eager step. The capture's warm-up passes leave the buffers (batch-norm statistics) as
    they were. None, with a warning, for a network that cannot be captured (one that syncs with the host).
    The gradients a replay gives are the graph's own buffers, which the next replay overwrites: safe here, where every
    step sets them to None before its backward and uses them up before the next (pytorch/pytorch#181723)."""
    saved = [b.clone() for b in model.buffers()]
    # the capture's warm-up makes the parameters' gradient accumulators on its side stream, which autograd warns of
    # at the backward passes after it (bench/train.py times the graphed steps with whatever sync that costs)
    getattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch", lambda _: None)(False)
    try:
        with torch.autocast("cuda", dtype=amp_dtype or torch.float16, enabled=amp_dtype is not None,
                            cache_enabled=False):  # the API's rule for autocast
            return torch.cuda.make_graphed_callables(_Network(model), (sample.clone(),))
    except Exception as e:  # noqa: BLE001 - whatever stops the capture: the candidate trains eagerly instead
        log.warning("train.cuda_graphs: the network could not be captured (%s: %s); it trains without CUDA graphs",
                    type(e).__name__, e)
        return None
    finally:
        with torch.no_grad():
            for b, s in zip(model.buffers(), saved):
                b.copy_(s)


def sync(device: torch.device) -> None:
    if device.type in GPU_TYPES:
        getattr(torch, device.type).synchronize(device)
