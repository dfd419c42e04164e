"""The paired statistics of the search benchmark's protocol (bench/PROTOCOL.md): one contestant against another over
the (dataset, seed) runs both finished, a one-sided exact Wilcoxon signed-rank test over all of them and, per
dataset, the mean difference with a percentile bootstrap confidence interval."""
from __future__ import annotations

import itertools
import math
import statistics

import numpy as np

EXACT_UP_TO = 20  # pairs up to which the null distribution is enumerated (2^20 sign assignments); beyond, normal


def wilcoxon_greater(diffs: list[float]) -> float:
    """P-value of the one-sided Wilcoxon signed-rank test that the differences lean positive: zero differences are
    dropped, tied magnitudes share their mean rank, and the null distribution (each sign equally likely) is exact
    for up to EXACT_UP_TO differences, the normal approximation beyond. 1.0 for no difference at all."""
    d = [x for x in diffs if x != 0]
    if not d:
        return 1.0
    order = sorted(range(len(d)), key=lambda i: abs(d[i]))
    ranks = [0.0] * len(d)
    done = 0
    for _, tied in itertools.groupby(order, key=lambda i: abs(d[i])):
        tied = list(tied)
        for i in tied:
            ranks[i] = done + (len(tied) + 1) / 2
        done += len(tied)
    observed = sum(r for r, x in zip(ranks, d) if x > 0)
    n = len(d)
    if n <= EXACT_UP_TO:
        sums = np.zeros(1, dtype=np.float64)
        for r in ranks:  # the distribution of the positive ranks' sum, one rank at a time
            sums = np.concatenate([sums, sums + r])
        return float(np.mean(sums >= observed - 1e-9))
    mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return 0.5 * math.erfc((observed - 0.5 - mean) / sd / math.sqrt(2))


def bootstrap_ci(diffs: list[float], resamples: int = 10_000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean difference."""
    rng = np.random.default_rng(seed)
    a = np.asarray(diffs, dtype=np.float64)
    means = a[rng.integers(0, len(a), size=(resamples, len(a)))].mean(axis=1)
    return float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2))


def compare(rows: list[dict], a: str, b: str, datasets: list[str], *, one_machine: bool = False) -> str:
    """Lines for the table: `a` against `b` over `datasets`, paired by (dataset, seed) where both have a test
    score, and with `one_machine` only two runs of one machine (each row names it); the differences are a's minus
    b's."""
    score = {(r["dataset"], r["contestant"], r["seed"], r["machine"] if one_machine else None): r["test"]
             for r in rows if r["test"] is not None}
    pairs = {d: [score[d, a, s, m] - score[d, b, s, m] for (dd, c, s, m) in score
                 if dd == d and c == a and (d, b, s, m) in score] for d in datasets}
    every = [x for d in datasets for x in pairs[d]]
    where = " on one machine" * one_machine
    if not every:
        return f"{a} against {b}: no (dataset, seed) run{where} that both finished"
    runs = f"{len(every)} paired run" + "s" * (len(every) != 1) + where
    lines = [f"{a} against {b} over {', '.join(datasets)}: {runs}, mean difference "
             f"{statistics.mean(every):+.4f}, one-sided Wilcoxon signed-rank p = {wilcoxon_greater(every):.4f}"]
    lines += [group_line(d, pairs[d]) for d in datasets if pairs[d]]
    return "\n".join(lines)


def group_line(name: str, diffs: list[float]) -> str:
    """One group's line under a paired test: its one difference, or the mean and its bootstrap interval."""
    if len(diffs) == 1:
        return f"  {name}: 1 pair, difference {diffs[0]:+.4f}"
    low, high = bootstrap_ci(diffs)
    return (f"  {name}: {len(diffs)} pairs, mean difference {statistics.mean(diffs):+.4f} "
            f"(95% bootstrap interval {low:+.4f} to {high:+.4f})")
