"""Weight inheritance: a child network starts from its parent's trained weights where their layers match.

The layers (modules that hold tensors) of parent and child are aligned in order by their tensors' names and
shapes, as a diff aligns lines (difflib): a mutated learning rate or activation keeps every layer, an inserted or
removed layer shifts the rest without losing them, a changed width drops the layers whose shapes changed. What
does not match keeps its fresh initialisation. Real et al. (2017, "Large-Scale Evolution of Image Classifiers")
let children inherit this way so that training is not restarted from scratch at every step of the search.

A warm start generalises worse than a fresh one trained to the same loss (Ash & Adams, 2020, "On Warm-Starting
Neural Network Training": their remedy shrinks the old weights and perturbs them). Along a lineage the warm starts
compound: each generation trains its parent's weights on, to the point of memorising a small training split, and its
validation score, selected on at every generation, does not show it. `shrink` < 1 starts each inherited parameter
at shrink * the parent's + (1 - shrink) * its own fresh initialisation; buffers (batch norm's running statistics)
are inherited as they are, and re-estimated by the first batches.
"""
from __future__ import annotations

import difflib

import torch

__all__ = ["inherit_weights"]


def _layers(state: dict[str, torch.Tensor]) -> list[tuple[str, tuple]]:
    """(module path, its tensors' (name, shape) in order) for each module with tensors; the network's own
    top-level buffers (the input and target normalisation of the data) are left out."""
    layers: dict[str, list] = {}
    for key, value in state.items():
        module, _, name = key.rpartition(".")
        if module:
            layers.setdefault(module, []).append((name, tuple(value.shape)))
    return [(module, tuple(tensors)) for module, tensors in layers.items()]


def inherit_weights(model: torch.nn.Module, parent: dict[str, torch.Tensor], shrink: float = 1.0) -> float:
    """Copy `parent`'s tensors (a state_dict) into `model` where the layers match, its parameters shrunk towards the
    model's own initialisation by `shrink` (1: as they are); returns the fraction of the model's parameters that were
    inherited (0.0 when nothing matched)."""
    own = model.state_dict()
    a, b = _layers(parent), _layers(own)
    matcher = difflib.SequenceMatcher(None, [t for _, t in a], [t for _, t in b], autojunk=False)
    copied = {}
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            (pa, tensors), (pb, _) = a[block.a + i], b[block.b + i]
            copied.update({f"{pb}.{name}": parent[f"{pa}.{name}"] for name, _ in tensors})
    params = dict(model.named_parameters())
    if shrink < 1.0:
        copied = {k: shrink * v + (1.0 - shrink) * own[k] if k in params else v for k, v in copied.items()}
    if copied:
        model.load_state_dict({**own, **copied})
    total = sum(p.numel() for p in params.values())
    return sum(params[k].numel() for k in copied if k in params) / max(total, 1)
