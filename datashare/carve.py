"""The validation split carved from train when a file has none: a fixed-seed permutation of train's rows.

Every rank and every run must agree on which rows are validation rows, so the choice is made in one place:
:func:`datashare.format.load` carves arrays in memory, and :func:`datashare.plan.dataset_plan` shares the whole
train split with the row indices of both parts.
"""

from __future__ import annotations

import numpy as np

__all__ = ["carve_indices", "carve_val", "carved_count", "holdout_indices"]

HOLDOUT_SEED = 7  # the validation rows held back from the search ([train] holdout) are drawn apart from the carving

#: bytes of rows moved per step when compacting train in place
COMPACT_BYTES = 16 << 20


def carved_count(n: int, val_fraction: float) -> int:
    """How many of ``n`` training samples a carve takes for val: at least one, and one fewer than ``n`` at most."""
    return min(n - 1, max(1, int(round(val_fraction * n))))


def carve_indices(n: int, *, val_fraction: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, val) row indices of a split of ``n`` training samples by a fixed-seed permutation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if n < 2:
        raise ValueError(f"cannot carve a validation split from {n} training sample(s)")
    n_val = carved_count(n, val_fraction)
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def carve_val(x: np.ndarray, y: np.ndarray, *, val_fraction: float = 0.1, seed: int = 0
              ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Split train into (train, val) by a fixed-seed permutation, so every rank and every run agree on it.

    Both parts keep the original sample order. Train is compacted in place (its memory is reused), so the
    arrays passed in must not be used afterwards.
    """
    train_idx, val_idx = carve_indices(len(x), val_fraction=val_fraction, seed=seed)
    x_val, y_val = x[val_idx], y[val_idx]
    # in-place compaction: train_idx is sorted and train_idx[k] >= k, so block k..k+s only reads rows >= k
    step = max(1, COMPACT_BYTES // max(1, x[0].nbytes))
    for a in range(0, len(train_idx), step):
        idx = train_idx[a:a + step]
        if idx[0] == a and idx[-1] == a + len(idx) - 1:
            continue  # already in place
        x[a:a + len(idx)] = x[idx]
        y[a:a + len(idx)] = y[idx]
    n_train = len(train_idx)
    return (x[:n_train], y[:n_train]), (x_val, y_val)


def holdout_indices(n: int, share: float) -> tuple[np.ndarray, np.ndarray]:
    """The validation split's rows (sorted) that trainings score on, and those held back for a run's final pick
    (`[train] holdout`): a fixed-seed share of the `n` rows, at least one of each."""
    if not 0.0 < share < 1.0 or n < 2:
        raise ValueError(f"cannot hold back a share {share} of a validation split of {n} sample(s)")
    order = np.random.default_rng(HOLDOUT_SEED).permutation(n)
    held = min(n - 1, max(1, int(round(share * n))))
    return np.sort(order[held:]), np.sort(order[:held])
