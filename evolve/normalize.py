"""What every Galapagos network carries: its inputs normalised, and regression outputs put back in target units.

The statistics (of the training split) are buffers of the module, so a saved ``state_dict`` predicts in original
units with no extra files. Regression targets are normalised per target, field targets per target channel.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .dense import field_stats
from .problem import Problem

__all__ = ["BuiltNet", "Normalized", "normalization_stats", "set_normalization"]


class Normalized(nn.Module):
    """What every Galapagos network carries: inputs normalised, regression outputs put back in target units.

    Buffers ``x_mean``/``x_std`` (per channel, or per feature for tabular data) and, for regression and fields,
    ``y_mean``/``y_std`` (per target, or per target channel) are part of the state_dict; fill them with
    :func:`set_normalization`.
    Subclasses compute `body(x)` on normalised inputs.
    """

    def __init__(self, problem: Problem) -> None:
        super().__init__()
        self.problem = problem
        self._stat_shape = (1, problem.channels) + (1,) * problem.spatial_dims
        self.register_buffer("x_mean", torch.zeros(problem.channels))
        self.register_buffer("x_std", torch.ones(problem.channels))
        self.regression = problem.task in ("regression", "field")
        # where the per-target statistics broadcast: (T,) after a vector, (1, T, 1, ...) on a field's channel axis
        self._y_shape = (1, problem.num_outputs) + (1,) * problem.spatial_dims if problem.task == "field" else (-1,)
        if self.regression:
            self.register_buffer("y_mean", torch.zeros(problem.num_outputs))
            self.register_buffer("y_std", torch.ones(problem.num_outputs))

    def body(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != len(self._stat_shape) or x.shape[1] != self._stat_shape[1]:
            raise ValueError(
                f"expected input of shape (N, {', '.join(map(str, self.problem.sample_shape))}), got {tuple(x.shape)}"
            )
        x = x.to(self.x_mean.dtype)  # uint8 / float16 data arrive as stored
        out = self.body((x - self.x_mean.view(self._stat_shape)) / self.x_std.view(self._stat_shape))
        if self.regression:
            out = out * self.y_std.view(self._y_shape) + self.y_mean.view(self._y_shape)
        return out


class BuiltNet(Normalized):
    """A network from a user's builder (`train.builder`): their module, with the normalisation of every Galapagos
    network around it, so that training, saving, prediction and export treat it as one of their own."""

    def __init__(self, net: nn.Module, problem: Problem) -> None:
        super().__init__(problem)
        self.net = net

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _as_vector(name: str, value: Any, n: int, like: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=like.dtype).reshape(-1)
    if t.numel() == 1 and n != 1:
        t = t.expand(n)
    if t.numel() != n:
        raise ValueError(f"{name}: expected {n} values, got shape {tuple(torch.as_tensor(value).shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: contains non-finite values")
    return t.to(like.device)


def _nonzero(std: torch.Tensor) -> torch.Tensor:
    """Zero (or tiny) standard deviations become 1, so that constant channels do not blow up."""
    return torch.where(std.abs() < 1e-12, torch.ones_like(std), std)


def set_normalization(
    model: Normalized,
    x_mean: Any,
    x_std: Any,
    y_mean: Any | None = None,
    y_std: Any | None = None,
) -> None:
    """Store training-set statistics in the model: inputs per channel/feature, regression targets per target.

    Zero (or tiny) standard deviations become 1 so that constant channels do not blow up.
    """
    c = model.x_mean.numel()
    std = _nonzero(_as_vector("x_std", x_std, c, model.x_std))
    with torch.no_grad():
        model.x_mean.copy_(_as_vector("x_mean", x_mean, c, model.x_mean))
        model.x_std.copy_(std)
    if y_mean is None and y_std is None:
        return
    if not getattr(model, "regression", False):
        raise ValueError("y_mean/y_std are only meaningful for regression models")
    t = model.y_mean.numel()
    with torch.no_grad():
        if y_mean is not None:
            model.y_mean.copy_(_as_vector("y_mean", y_mean, t, model.y_mean))
        if y_std is not None:
            model.y_std.copy_(_nonzero(_as_vector("y_std", y_std, t, model.y_std)))


def _channel_axes(x: torch.Tensor) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.dim()))


def normalization_stats(x: torch.Tensor, y: torch.Tensor, task: str, chunk_bytes: int = 16 << 20) -> dict:
    """Per-channel input mean/std and per-target mean/std, computed in float64 slices of about ``chunk_bytes``.

    Slices are cut by size, not by a row count: 4096 rows of 64 KiB images were 1.3 GiB of temporaries in every
    trainer, more than the node's shared copy of a 1 GiB dataset (bench/RESULTS.md, datashare).
    """
    s = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    ss = torch.zeros_like(s)
    count = 0
    chunk = max(1, chunk_bytes // (8 * math.prod(x.shape[1:])))
    for i in range(0, x.shape[0], chunk):
        xb = x[i:i + chunk].double()
        s += xb.sum(dim=_channel_axes(xb))
        ss += (xb * xb).sum(dim=_channel_axes(xb))
        count += xb.numel() // x.shape[1]
    mean = s / max(count, 1)
    std = (ss / max(count, 1) - mean * mean).clamp_min(0).sqrt().clamp_min(1e-6)
    stats = {"x_mean": mean.float(), "x_std": std.float()}
    if task == "regression":
        yd = y.double()
        stats["y_mean"] = yd.mean(0).float()
        stats["y_std"] = yd.std(0, unbiased=False).clamp_min(1e-6).float()
    elif task == "field":  # per target channel, over every pixel
        stats.update(field_stats(y))
    return stats
