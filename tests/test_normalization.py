"""evolve.train.normalization_stats: the same statistics whatever the slice size, on tensors and carved rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from galapagos.evolve.train import Rows, normalization_stats


@pytest.mark.parametrize("chunk_bytes", [1, 8 * 3 * 5 * 2 * 7, 16 << 20], ids=["one-row", "seven-rows", "whole"])
def test_statistics_do_not_depend_on_the_slice_size(chunk_bytes):
    rng = np.random.default_rng(2)
    x = torch.from_numpy((rng.standard_normal((101, 3, 5, 2)) * [[[4.0]], [[1.0]], [[0.5]]] + 3).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((101, 2)).astype(np.float32))
    got = normalization_stats(x, y, "regression", chunk_bytes=chunk_bytes)
    xd = x.double().transpose(0, 1).reshape(3, -1)
    assert torch.allclose(got["x_mean"], xd.mean(1).float(), atol=1e-6)
    assert torch.allclose(got["x_std"], xd.std(1, unbiased=False).float(), atol=1e-5)
    assert torch.allclose(got["y_mean"], y.double().mean(0).float(), atol=1e-6)


def test_carved_rows_give_the_statistics_of_those_rows_only():
    x = torch.arange(40, dtype=torch.float32).reshape(20, 2)
    index = torch.tensor([1, 3, 5, 19])
    got = normalization_stats(Rows(x, index), torch.zeros(4, dtype=torch.int64), "classification", chunk_bytes=16)
    assert torch.allclose(got["x_mean"], x[index].mean(0))
    assert "y_mean" not in got
