"""Scores of predictions: accuracy, NLL and calibration for classes; MSE, MAE and R^2 per target for regression;
mean and per-class IoU for segmentation; MSE, MAE and R^2 per target channel for fields."""
from __future__ import annotations

import numpy as np


def classification_metrics(probs: np.ndarray, y: np.ndarray, bins: int = 15) -> dict:
    """`probs` (N, K) class probabilities; ECE with `bins` equal-width confidence bins."""
    probs = np.asarray(probs, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    n = len(y)
    pred = probs.argmax(1)
    conf = probs.max(1)
    correct = pred == y
    nll = float(-np.log(np.clip(probs[np.arange(n), y], 1e-12, None)).mean()) if n else float("nan")
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.digitize(conf, edges[1:-1], right=True), 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            ece += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return {"accuracy": float(correct.mean()) if n else float("nan"), "nll": nll, "ece": float(ece), "samples": n}


def regression_metrics(pred: np.ndarray, y: np.ndarray, names: list[str] | None = None) -> dict:
    """Per target and mean over targets; R^2 = 1 - SSE/SST per target."""
    pred = np.asarray(pred, dtype=np.float64).reshape(len(y), -1)
    y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    err = pred - y
    mse = (err ** 2).mean(0)
    mae = np.abs(err).mean(0)
    var = y.var(0)
    r2 = 1.0 - mse / np.where(var > 0, var, np.nan)
    names = list(names) if names else [f"target_{i}" for i in range(y.shape[1])]
    per = {name: {"mse": float(mse[i]), "mae": float(mae[i]), "r2": float(r2[i])} for i, name in enumerate(names)}
    return {"mse": float(mse.mean()), "mae": float(mae.mean()), "r2": float(np.nanmean(r2)) if np.isfinite(r2).any()
            else float("nan"), "per_target": per, "samples": len(y)}


def _names(names: list[str] | None, n: int, stem: str) -> list[str]:
    return list(names) if names else [f"{stem}_{i}" for i in range(n)]


def segmentation_metrics(probs: np.ndarray, y: np.ndarray, ignore_index: int | None = None,
                         names: list[str] | None = None) -> dict:
    """`probs` (N, K, *spatial) per-pixel class probabilities, `y` (N, *spatial) labels: mean IoU over the classes
    that occur, IoU per class (None where a class is neither true nor predicted), pixel accuracy and per-pixel NLL,
    over the labelled pixels (evolve.dense computes the same during training)."""
    import torch

    from galapagos.evolve.dense import confusion, segmentation_scores

    probs, y = np.asarray(probs), np.asarray(y, dtype=np.int64)
    k = probs.shape[1]
    m = segmentation_scores(confusion(torch.from_numpy(probs.argmax(1)), torch.from_numpy(y), k, ignore_index))
    valid = np.ones(y.shape, bool) if ignore_index is None else y != ignore_index
    picked = np.take_along_axis(probs, np.where(valid, y, 0)[:, None], 1)[:, 0][valid]
    nll = float(-np.log(np.clip(picked.astype(np.float64), 1e-12, None)).mean()) if picked.size else float("nan")
    return {"miou": m["miou"], "pixel_accuracy": m["pixel_accuracy"], "nll": nll,
            "per_class": {name: {"iou": v} for name, v in zip(_names(names, k, "class"), m["iou"])},
            "samples": len(y), "pixels": int(valid.sum())}


def field_metrics(pred: np.ndarray, y: np.ndarray, names: list[str] | None = None) -> dict:
    """`pred` and `y` (N, T, *spatial): MSE, MAE and R^2 per target channel over every pixel, and their means (the
    keys of regression_metrics, so fields read like regression)."""
    import torch

    from galapagos.evolve.dense import field_scores, field_sums

    y = np.asarray(y)
    s = field_scores(field_sums(torch.from_numpy(np.asarray(pred)), torch.from_numpy(y)), y.size // y.shape[1])
    per = {name: {"mse": s["mse"][i], "mae": s["mae"][i], "r2": s["r2"][i]}
           for i, name in enumerate(_names(names, y.shape[1], "target"))}
    return {"mse": float(np.mean(s["mse"])), "mae": float(np.mean(s["mae"])), "r2": s["mean_r2"], "per_target": per,
            "samples": len(y)}
