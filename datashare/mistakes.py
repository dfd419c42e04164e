"""Common layout mistakes in a user's arrays, caught before they become a dataset of the wrong shape or meaning.

Each check returns None, or one line naming the array, what it looks like and the fix (an import option), so
that nothing is ever reinterpreted silently: channels-last images or signals (Galapagos wants channels first),
class labels that start at 1 or skip values (an empty class the network must still output), integer targets with
hundreds of distinct values inferred as classes (likely quantities), and classes rare enough to deserve a warning.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

MANY_CLASSES = 100  # distinct integer targets beyond which "classification" is a guess worth asking about
IMBALANCE = 10.0  # largest class over smallest present class, beyond which a warning is due


def channels_last(name: str, sample_shape: tuple[int, ...]) -> str | None:
    """(L, C), (H, W, C) or (D, H, W, C) samples with a last axis of 1, 3 or 4 behind a large first one."""
    if len(sample_shape) < 2 or sample_shape[-1] not in (1, 3, 4) or sample_shape[0] < 8:
        return None
    first = (sample_shape[-1], *sample_shape[:-1])
    return (f"{name}: samples of shape {sample_shape} look channels-last (a last axis of {sample_shape[-1]} behind "
            f"{sample_shape[0]}); Galapagos reads channels first, {first}: pass --channels-last to move the axis, "
            f"or --channels-first if {sample_shape[0]} really is the channel count")


def label_gaps(name: str, labels: np.ndarray) -> str | None:
    """Distinct labels that do not run 0..K-1: 1-based, or with values skipped."""
    if labels.size == 0 or (labels[0] == 0 and labels[-1] == labels.size - 1):
        return None
    k = int(labels[-1]) + 1
    if labels[0] == 1 and labels[-1] == labels.size:
        what = f"labels run 1..{labels.size}: class 0 never occurs"
    else:
        missing = sorted(set(range(k)) - set(labels.tolist()))
        shown = ", ".join(map(str, missing[:5])) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        what = f"labels skip {shown}: those classes never occur among 0..{k - 1}"
    return (f"{name}: {what}; pass --relabel to map the {labels.size} distinct labels to 0..{labels.size - 1}, "
            f"or --num-classes {k} if the missing classes are real but absent")


def many_classes(name: str, labels: np.ndarray) -> str | None:
    """Integer targets with hundreds of distinct values, when the task was only inferred from their dtype."""
    if labels.size <= MANY_CLASSES:
        return None
    return (f"{name}: {labels.size} distinct integer values would make {int(labels[-1]) + 1} classes; if they are "
            "quantities pass --task regression, if they are classes pass --task classification")


def imbalance(name: str, counts: Mapping[int, int]) -> str | None:
    """A warning when the largest class outnumbers the smallest present one IMBALANCE times or more."""
    present = {k: v for k, v in counts.items() if v > 0}
    if len(present) < 2:
        return None
    big, small = max(present, key=present.get), min(present, key=present.get)
    ratio = present[big] / present[small]
    if ratio < IMBALANCE:
        return None
    return (f"{name}: class {small} has {present[small]:,} samples, class {big} {present[big]:,} ({ratio:.0f}x): "
            "accuracy will favour the large classes")


def review(path, info) -> list[str]:
    """What `data check` warns about in a dataset file that is valid but may not mean what its author meant."""
    import h5py

    found = [w for w in [channels_last(f"{path}: /train/x", tuple(info.sample_shape))] if w]
    if info.task == "classification":
        with h5py.File(path, "r") as f:
            ys = {s: f[s]["y"][()] for s in info.splits}
        labels = np.unique(np.concatenate(list(ys.values())))
        missing = sorted(set(range(info.num_classes)) - set(labels.tolist()))
        if missing:
            shown = ", ".join(map(str, missing[:10]))
            found.append(f"{path}: classes {shown} of 0..{info.num_classes - 1} occur in no split: the network "
                         "still has an output for each")
        counts = dict(zip(*np.unique(ys["train"], return_counts=True)))
        found += [w for w in [imbalance(f"{path}: /train/y", {int(k): int(v) for k, v in counts.items()})] if w]
    return found
