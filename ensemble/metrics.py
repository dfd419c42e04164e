"""Scores of predictions: accuracy, NLL and calibration for classes; MSE, MAE and R^2 per target for regression."""
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
