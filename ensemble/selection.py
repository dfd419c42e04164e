"""Greedy forward selection with replacement (Caruana et al. 2004): keep only the members that help on val.

Members are added one at a time, with replacement, each time the one whose addition lowers the validation score
most; a member picked twice counts twice. The ensemble's prediction is the weighted mean of its members'
predictions (class probabilities or regression outputs) with weights = picks / total picks.

Bagged selection (`bags` > 0; Caruana et al., "Getting the most out of ensemble selection", ICDM 2006) runs the
same greedy selection in each of `bags` random bags of half the members and averages the bags' weights: a greedy
run that stops at its first member, or leans on one member that fits val by chance, is one bag of many.

Scores are lower-is-better: the negative log-likelihood of the mean probabilities for classification, and for
regression the mean squared error with each target in units of its validation variance (1 - R^2, so targets
measured on different scales count alike; with one target it is the MSE up to a constant factor).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EPS = 1e-12  # probabilities are clipped here before the log, as in ensemble.metrics


@dataclass(frozen=True)
class Selection:
    weights: np.ndarray  # (K,) picks / total picks; 0 for members never picked
    counts: np.ndarray  # (K,) how often each member was picked
    picks: tuple[int, ...]  # member index of every accepted step, in order
    trace: tuple[float, ...]  # validation score after each accepted step (never increasing)
    member_scores: tuple[float, ...]  # each member's own validation score
    metric: str  # "nll" or "nmse"
    rounds: int  # rounds tried (accepted steps + the final one that found no improvement, if any)
    bags: int = 0  # bagged selection's bags (picks, counts and rounds are then every bag's; trace the final score)

    @property
    def score(self) -> float:
        return self.trace[-1]

    def to_dict(self) -> dict:
        method = "greedy forward selection with replacement (Caruana et al. 2004)"
        if self.bags:
            method = f"bagged ensemble selection, {self.bags} bags of half the members (Caruana et al. 2006)"
        return {"method": method, "metric": self.metric, "score": self.score, "trace": list(self.trace),
                "picks": list(self.picks), "counts": [int(c) for c in self.counts],
                "member_scores": list(self.member_scores), "rounds": self.rounds, "bags": self.bags}


def combine(preds: np.ndarray | Sequence[np.ndarray], weights: np.ndarray | Sequence[float]) -> np.ndarray:
    """The ensemble's prediction: the weighted mean over members of (K, N, C) predictions."""
    p = np.asarray(preds, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    return np.tensordot(w / w.sum(), p, axes=1)


def pixel_samples(preds: Sequence[np.ndarray], y: np.ndarray, task: str, ignore_index: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, str]:
    """Dense predictions (K members, N, C, *spatial) as samples, one per (labelled) pixel: (K, pixels, C), their
    truth, and the task selection scores them as (segmentation: classification; field: regression)."""
    p = np.asarray(preds)
    p = np.moveaxis(p, 2, -1).reshape(p.shape[0], -1, p.shape[2])
    y = np.asarray(y)
    if task == "segmentation":
        flat = y.reshape(-1)
        keep = flat != ignore_index if ignore_index is not None else np.ones(flat.shape, bool)
        return p[:, keep], flat[keep], "classification"
    return p, np.moveaxis(y, 1, -1).reshape(-1, y.shape[1]), "regression"


def score(pred: np.ndarray, y: np.ndarray, task: str) -> float:
    """Lower is better: NLL of class probabilities (N, K), or variance-normalised MSE of outputs (N, T)."""
    return float(_scores(np.asarray(pred, dtype=np.float64)[None], _target(y, task), task)[0])


def _target(y: np.ndarray, task: str) -> np.ndarray:
    if task == "classification":
        return np.asarray(y, dtype=np.int64)
    y = np.asarray(y, dtype=np.float64)
    return y.reshape(len(y), -1)


def _scores(sums: np.ndarray, y: np.ndarray, task: str, norm: float = 1.0) -> np.ndarray:
    """Score of each candidate mean prediction `sums[k] / norm`, vectorised over k."""
    if task == "classification":
        p_true = sums[:, np.arange(len(y)), y] / norm
        return -np.log(np.clip(p_true, EPS, None)).mean(axis=1)
    var = y.var(axis=0)
    var = np.where(var > 0, var, 1.0)
    err = sums.reshape(len(sums), len(y), -1) / norm - y[None]
    return ((err ** 2).mean(axis=1) / var).mean(axis=1)


def select(preds: np.ndarray | Sequence[np.ndarray], y: np.ndarray, task: str, *, max_rounds: int = 50,
           init: int = 1, bags: int = 0, seed: int = 0) -> Selection:
    """Pick members for the ensemble from their validation predictions `preds` (K arrays of (N, C)).

    Starts from the best single member, or from up to `init` best members added in order while each helps
    ("sorted initialisation"); then adds, with replacement, the member that lowers the score most, until none
    lowers it or `max_rounds` steps were taken. No accepted step ever makes the validation score worse. With
    `bags`, that selection in each of `bags` bags of half the members (drawn with `seed`), the weights averaged.
    """
    p = np.asarray(preds, dtype=np.float64)
    if p.ndim == 2:
        p = p[:, :, None]
    if p.ndim != 3 or len(p) == 0:
        raise ValueError(f"selection: expected predictions of K >= 1 members, shape (K, N, C); got {p.shape}")
    if task not in ("classification", "regression"):
        raise ValueError(f"selection: unknown task {task!r}")
    if max_rounds < 1 or init < 1 or bags < 0:
        raise ValueError("selection: max_rounds and init must be at least 1, bags at least 0")
    y = _target(y, task)
    if len(y) != p.shape[1] or len(y) == 0:
        raise ValueError(f"selection: {p.shape[1]} predictions per member but {len(y)} targets")
    return _bagged(p, y, task, max_rounds, init, bags, seed) if bags else _greedy(p, y, task, max_rounds, init)


def _bagged(p: np.ndarray, y: np.ndarray, task: str, max_rounds: int, init: int, bags: int, seed: int
            ) -> Selection:
    rng = np.random.default_rng(seed)
    weights, picks, rounds = np.zeros(len(p)), [], 0
    for _ in range(bags):
        bag = rng.choice(len(p), max(1, len(p) // 2), replace=False)
        sel = _greedy(p[bag], y, task, max_rounds, init)
        weights[bag] += sel.weights
        picks += [int(bag[i]) for i in sel.picks]
        rounds += sel.rounds
    weights /= bags
    return Selection(weights=weights, counts=np.bincount(picks, minlength=len(p)), picks=tuple(picks),
                     trace=(score(combine(p, weights), y, task),),
                     member_scores=tuple(float(s) for s in _scores(p, y, task)), metric=_metric(task),
                     rounds=rounds, bags=bags)


def _metric(task: str) -> str:
    return "nll" if task == "classification" else "nmse"


def _greedy(p: np.ndarray, y: np.ndarray, task: str, max_rounds: int, init: int) -> Selection:
    singles = _scores(p, y, task)
    order = np.argsort(singles, kind="stable")
    counts = np.zeros(len(p), dtype=np.int64)
    total = p[order[0]].copy()
    counts[order[0]] = 1
    picks, trace = [int(order[0])], [float(singles[order[0]])]
    for k in order[1:init]:  # sorted initialisation, as long as each next-best member helps
        new = float(_scores((total + p[k])[None], y, task, counts.sum() + 1)[0])
        if not new < trace[-1]:
            break
        total += p[k]
        counts[k] += 1
        picks.append(int(k))
        trace.append(new)
    rounds = 0
    while len(picks) < max_rounds:
        rounds += 1
        candidates = _scores(total[None] + p, y, task, counts.sum() + 1)
        best = int(np.argmin(candidates))  # ties: the lowest index
        if not candidates[best] < trace[-1]:
            break
        total += p[best]
        counts[best] += 1
        picks.append(best)
        trace.append(float(candidates[best]))
    return Selection(weights=counts / counts.sum(), counts=counts, picks=tuple(picks), trace=tuple(trace),
                     member_scores=tuple(float(s) for s in singles),
                     metric=_metric(task), rounds=rounds)
