"""Dense (per-pixel) tasks: the U-Net decoder that ends their networks, their losses and their metrics.

A genome's spatial genes are the encoder. Before every gene that changes the spatial size (a pool, a strided
conv) the features are kept as a skip; the decoder then goes back up in reverse order: upsample to the skip's
size (nearest neighbour, so odd sizes come back exactly), concatenate the skip, a 3-wide conv back to the incoming
width and ReLU, as U-Net does (Ronneberger et al. 2015). A 1x1 conv gives the classes or target channels per
pixel. Metrics are kept as sums (a confusion matrix, per-channel moments) so validation of any size runs batch by
batch, and the same functions score predictions in `galapagos predict` (ensemble/metrics.py).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .check import DECODER_KERNEL

__all__ = ["Decoder", "class_counts", "segmentation_loss", "field_loss", "field_stats",
           "confusion", "segmentation_scores", "field_sums", "field_scores", "evaluate_dense"]

_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


class Decoder(nn.Module):
    """Up from the encoder's last features (``channels`` wide) through one stage per skip, then a 1x1 conv."""

    def __init__(self, skips: Sequence[int], channels: int, outputs: int, nd: int) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            nn.Sequential(_CONV[nd](channels + c, channels, DECODER_KERNEL, padding=DECODER_KERNEL // 2), nn.ReLU())
            for c in reversed(skips))
        self.out = _CONV[nd](channels, outputs, 1)

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
        for stage, skip in zip(self.stages, reversed(skips)):
            # https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.interpolate.html (size=, "nearest")
            x = F.interpolate(x, size=skip.shape[2:], mode="nearest")
            x = stage(torch.cat([x, skip.to(x.dtype)], 1))
        return self.out(x)


# -- losses ------------------------------------------------------------------------------------------------------
def class_counts(y: torch.Tensor, num_classes: int, ignore_index: int | None, chunk: int = 256) -> torch.Tensor:
    """Pixels of each class in a split of labels (N, *spatial), counted chunk by chunk; ignored pixels left out."""
    counts = torch.zeros(num_classes, dtype=torch.float64, device=y.device)
    for i in range(0, y.shape[0], chunk):
        yb = y[i:i + chunk].reshape(-1)
        if ignore_index is not None:
            yb = yb[yb != ignore_index]
        counts += torch.bincount(yb, minlength=num_classes).double()
    return counts


def segmentation_loss(kind: str, counts: torch.Tensor, ignore_index: int | None) -> Callable:
    """The genome's loss on logits (N, K, *spatial) and labels (N, *spatial): cross-entropy ("ce"), cross-entropy
    with inverse-frequency class weights from the training split's ``counts`` ("weighted_ce"), or soft Dice."""
    ignore = -100 if ignore_index is None else ignore_index  # F.cross_entropy's own default for "none"
    if kind == "ce":
        return lambda out, y: F.cross_entropy(out.float(), y, ignore_index=ignore)
    if kind == "weighted_ce":
        # weight_c = pixels / (classes * pixels of c); a class absent from train gets the weight of a 1-pixel class
        w = (counts.sum() / (len(counts) * counts.clamp_min(1))).float()
        return lambda out, y: F.cross_entropy(out.float(), y, weight=w.to(out.device), ignore_index=ignore)
    if kind == "dice":
        return lambda out, y: _dice(out.float(), y, ignore_index)
    raise ValueError(f"genome.loss: unknown segmentation loss {kind!r}")


def _dice(out: torch.Tensor, y: torch.Tensor, ignore_index: int | None, eps: float = 1.0) -> torch.Tensor:
    """1 - mean over classes of 2|P∩Y| / (|P| + |Y|), with soft P (softmax) and unlabelled pixels left out."""
    valid = (torch.ones_like(y, dtype=torch.bool) if ignore_index is None else y != ignore_index).unsqueeze(1)
    prob = out.softmax(1) * valid
    onehot = torch.zeros_like(prob).scatter_(1, torch.where(valid, y.unsqueeze(1), 0), 1.0) * valid
    axes = (0, *range(2, out.dim()))
    inter = (prob * onehot).sum(axes)
    return 1 - ((2 * inter + eps) / (prob.sum(axes) + onehot.sum(axes) + eps)).mean()


def field_loss(y_mean: torch.Tensor, y_std: torch.Tensor) -> Callable:
    """MSE of fields (N, T, *spatial) normalised per target channel, so each channel counts alike."""
    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (y.dim() - 2)
        m, s = y_mean.view(shape), y_std.view(shape)
        return F.mse_loss((out.float() - m) / s, (y - m) / s)
    return loss


def field_stats(y: torch.Tensor, chunk: int = 256) -> dict:
    """Per target channel mean and std of target fields (N, T, *spatial), in float64 chunk by chunk."""
    s = ss = 0
    for i in range(0, y.shape[0], chunk):
        yb = y[i:i + chunk].double().transpose(0, 1).reshape(y.shape[1], -1)
        s, ss = s + yb.sum(1), ss + (yb * yb).sum(1)
    count = y.numel() // y.shape[1]
    mean = s / count
    std = (ss / count - mean * mean).clamp_min(0).sqrt().clamp_min(1e-6)
    return {"y_mean": mean.float(), "y_std": std.float()}


# -- metrics -----------------------------------------------------------------------------------------------------
def confusion(pred: torch.Tensor, y: torch.Tensor, num_classes: int, ignore_index: int | None) -> torch.Tensor:
    """Confusion counts (true class, predicted class) over the labelled pixels."""
    pred, y = pred.reshape(-1), y.reshape(-1)
    if ignore_index is not None:
        keep = y != ignore_index
        pred, y = pred[keep], y[keep]
    return torch.bincount(y * num_classes + pred, minlength=num_classes ** 2).reshape(num_classes, num_classes)


def segmentation_scores(conf: torch.Tensor) -> dict:
    """Per-class IoU = TP / (TP + FP + FN), its mean over the classes that occur (in truth or prediction), and
    pixel accuracy."""
    conf = conf.double()
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp
    iou = tp / union.clamp_min(1)
    present = union > 0
    miou = iou[present].mean().item() if present.any() else float("nan")
    total = conf.sum().item()
    return {"miou": miou, "iou": [round(v, 6) if p else None for v, p in zip(iou.tolist(), present.tolist())],
            "pixel_accuracy": tp.sum().item() / total if total else float("nan")}


def field_sums(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(4, T) sums over the pixels of a batch: squared error, absolute error, y, y^2 (float64)."""
    t = y.shape[1]
    p = pred.double().transpose(0, 1).reshape(t, -1)
    v = y.double().transpose(0, 1).reshape(t, -1)
    err = p - v
    return torch.stack([(err * err).sum(1), err.abs().sum(1), v.sum(1), (v * v).sum(1)])


def field_scores(sums: torch.Tensor, count: int) -> dict:
    """Per target channel MSE, MAE and R^2 = 1 - SSE/SST (SST around the channel's mean over every pixel)."""
    sse, sae, s, ss = sums
    sst = ss - s * s / count
    r2 = [1 - e / v if v > 0 else float("nan") for e, v in zip(sse.tolist(), sst.tolist())]
    finite = [v for v in r2 if math.isfinite(v)]
    return {"mse": (sse / count).tolist(), "mae": (sae / count).tolist(), "r2": r2,
            "mean_r2": sum(finite) / len(finite) if finite else float("nan")}


def evaluate_dense(model: nn.Module, x, y: torch.Tensor, problem, batch: int, autocast: Callable) -> dict:
    """Validation metrics of a dense problem, batch by batch; the fitness is mean IoU, or mean R^2 of a field."""
    model.eval()
    k, ignore = problem.num_outputs, problem.ignore_index
    seg = problem.task == "segmentation"
    conf = torch.zeros(k, k, dtype=torch.long, device=y.device) if seg else 0
    loss, sums, labelled = 0.0, 0, 0
    with torch.no_grad(), autocast():
        for i in range(0, y.shape[0], batch):
            out, yb = model(x[i:i + batch]).float(), y[i:i + batch]
            if seg:
                loss += F.cross_entropy(out, yb, ignore_index=-100 if ignore is None else ignore,
                                        reduction="sum").item()
                labelled += int(yb.numel() if ignore is None else (yb != ignore).sum())
                conf = conf + confusion(out.argmax(1), yb, k, ignore)
            else:
                sums = sums + field_sums(out, yb)
    if seg:
        m = segmentation_scores(conf)
        return {"val_loss": loss / max(labelled, 1), "val_miou": m["miou"], "val_pixel_accuracy":
                m["pixel_accuracy"], "val_iou": m["iou"], "fitness": m["miou"]}
    count = y.numel() // y.shape[1]
    m = field_scores(sums, count)
    sst = sums[3] - sums[2] ** 2 / count
    return {"val_loss": (sums[0] / sst.clamp_min(1e-12)).mean().item(), "val_mse": sum(m["mse"]) / len(m["mse"]),
            "val_mse_per_target": m["mse"], "val_r2": m["mean_r2"], "fitness": m["mean_r2"]}
