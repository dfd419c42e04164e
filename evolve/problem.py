"""What is being learned: the per-sample input shape, the task and the number of outputs.

A :class:`Problem` is everything the search needs to know about a dataset; it is small and picklable so the master
can send it to workers once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from galapagos.datashare.format import DENSE_TASKS, TASKS  # the tasks the data format knows
from galapagos.evolve.settings import is_int

__all__ = ["Problem", "TASKS"]


@dataclass(frozen=True)
class Problem:
    """Per-sample input shape ``(F,)``, ``(C, L)``, ``(C, H, W)`` or ``(C, D, H, W)``, task and output count.

    For the dense tasks (segmentation, field) ``num_outputs`` is per pixel/voxel (classes or target channels) and
    ``ignore_index`` (segmentation) the label of unlabelled pixels.
    """

    sample_shape: tuple[int, ...]
    task: str
    num_outputs: int
    ignore_index: int | None = None

    def __post_init__(self) -> None:
        shape = self.sample_shape
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise ValueError(f"problem.sample_shape: expected a sequence of positive integers, got {shape!r}")
        shape = tuple(shape)
        if not 1 <= len(shape) <= 4 or not all(is_int(s) and s >= 1 for s in shape):
            raise ValueError(
                "problem.sample_shape: expected 1 to 4 positive integers ((F,), (C, L), (C, H, W) or (C, D, H, W)), "
                f"got {list(shape)}"
            )
        object.__setattr__(self, "sample_shape", tuple(int(s) for s in shape))
        if self.task not in TASKS:
            raise ValueError(f"problem.task: expected one of {', '.join(TASKS)}, got {self.task!r}")
        if not is_int(self.num_outputs) or self.num_outputs < 1:
            raise ValueError(f"problem.num_outputs: expected a positive integer, got {self.num_outputs!r}")
        object.__setattr__(self, "num_outputs", int(self.num_outputs))
        if self.is_dense and len(shape) < 2:
            raise ValueError(f"problem.sample_shape: {self.task} needs spatial axes ((C, L), (C, H, W) or "
                             f"(C, D, H, W)), got {list(shape)}")
        if self.ignore_index is not None and (self.task != "segmentation" or not is_int(self.ignore_index)):
            raise ValueError(f"problem.ignore_index: an integer label for segmentation only, got "
                             f"{self.ignore_index!r} for {self.task}")

    @property
    def spatial_dims(self) -> int:
        """0 for tabular data, else the number of spatial axes after the channel axis."""
        return len(self.sample_shape) - 1

    @property
    def channels(self) -> int:
        """Input channels (or features for tabular data): the axis that input normalisation works along."""
        return self.sample_shape[0]

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return self.sample_shape[1:]

    @property
    def is_classification(self) -> bool:
        return self.task == "classification"

    @property
    def is_dense(self) -> bool:
        """An output per pixel/voxel (segmentation, field): networks end in a decoder, not a vector head."""
        return self.task in DENSE_TASKS

    @property
    def shiftable(self) -> bool:
        """Inputs with spatial axes and targets without: a training sample may be translated (the ``shift`` gene)
        and keep its target."""
        return self.spatial_dims > 0 and not self.is_dense

    @classmethod
    def of_dataset(cls, info: Any) -> "Problem":
        """The problem a dataset poses (a datashare.format.DatasetInfo: sample_shape, task, num_targets)."""
        return cls(tuple(info.sample_shape), info.task, info.num_targets, getattr(info, "ignore_index", None))

    def mismatch(self, info: Any) -> str | None:
        """Why a dataset does not fit networks made for this problem (e.g. "classification with samples of shape
        (1, 12, 12) and 4 outputs; the file has ..."), or None when it fits."""
        other = Problem.of_dataset(info)
        if other == self:
            return None
        names = {"task": "task", "sample_shape": "sample shape", "num_outputs": "outputs",
                 "ignore_index": "ignore_index"}
        differ = [f"{name} {getattr(self, key)!r} vs {getattr(other, key)!r}" for key, name in names.items()
                  if getattr(self, key) != getattr(other, key)]
        return (f"{self.task} with samples of shape {self.sample_shape} and {self.num_outputs} outputs; the file "
                f"has {info.task}, {tuple(info.sample_shape)}, {info.num_targets} (what differs: {', '.join(differ)})")

    def to_dict(self) -> dict[str, Any]:
        d = {"sample_shape": list(self.sample_shape), "task": self.task, "num_outputs": self.num_outputs}
        return d if self.ignore_index is None else {**d, "ignore_index": self.ignore_index}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Problem":
        known = {"sample_shape", "task", "num_outputs"}
        unknown = sorted(set(d) - known - {"ignore_index"})
        if unknown:
            raise ValueError(f"problem.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        missing = sorted(known - set(d))
        if missing:
            raise ValueError(f"problem.{missing[0]}: missing")
        return cls(sample_shape=tuple(d["sample_shape"]), task=d["task"], num_outputs=d["num_outputs"],
                   ignore_index=d.get("ignore_index"))
