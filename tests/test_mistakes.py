"""`data import` and `data check` catch common layout mistakes: one line with the fix, never a silent guess."""
from __future__ import annotations

import numpy as np
import pytest

from galapagos.datashare.format import DataError
from galapagos.datashare.write import import_npz
from tests.test_evolve_run import galapagos

RNG = np.random.default_rng(0)


def npz(tmp_path, x, y, **more):
    path = tmp_path / "d.npz"
    np.savez(path, x_train=x, y_train=y, **more)
    return path


def test_channels_last_images_are_refused_with_the_fix(tmp_path):
    x = RNG.random((40, 16, 16, 3), dtype=np.float32)
    src = npz(tmp_path, x, np.arange(40) % 4)
    with pytest.raises(DataError, match=r"look channels-last .* pass --channels-last to move the axis"):
        import_npz(src, tmp_path / "a.h5")
    info = import_npz(src, tmp_path / "b.h5", channels_last=True)
    assert info.sample_shape == (3, 16, 16)
    import h5py

    with h5py.File(tmp_path / "b.h5") as f:
        np.testing.assert_array_equal(f["train/x"][5], np.moveaxis(x[5], -1, 0))
    assert import_npz(src, tmp_path / "c.h5", channels_last=False).sample_shape == (16, 16, 3)


def test_channels_first_data_is_left_alone(tmp_path):
    src = npz(tmp_path, RNG.random((40, 3, 16, 16), dtype=np.float32), np.arange(40) % 4)
    assert import_npz(src, tmp_path / "a.h5").sample_shape == (3, 16, 16)


@pytest.mark.parametrize("y, words", [
    (np.arange(40) % 4 + 1, "labels run 1..4: class 0 never occurs"),
    (np.array([0, 1, 5, 7] * 10), "labels skip 2, 3, 4, 6"),
])
def test_labels_that_are_not_0_to_k(tmp_path, y, words):
    src = npz(tmp_path, RNG.random((40, 5), dtype=np.float32), y)
    with pytest.raises(DataError, match=words + r".*pass --relabel"):
        import_npz(src, tmp_path / "a.h5")
    assert import_npz(src, tmp_path / "b.h5", relabel=True).num_classes == 4
    assert import_npz(src, tmp_path / "c.h5", num_classes=int(y.max()) + 1).num_classes == y.max() + 1


def test_hundreds_of_integer_targets_are_not_taken_for_classes(tmp_path):
    src = npz(tmp_path, RNG.random((600, 5), dtype=np.float32), RNG.integers(0, 1000, 600))
    with pytest.raises(DataError, match="distinct integer values would make .* classes; if they are quantities "
                                        "pass --task regression"):
        import_npz(src, tmp_path / "a.h5")
    assert import_npz(src, tmp_path / "b.h5", task="regression").task == "regression"


def test_imbalance_warns_on_import_and_check(tmp_path):
    y = np.array([0] * 300 + [1] * 10)
    src = npz(tmp_path, RNG.random((310, 5), dtype=np.float32), y)
    proc = galapagos("data", "import", src, tmp_path / "a.h5")
    assert proc.returncode == 0 and "class 1 has 10 samples, class 0 300 (30x)" in proc.stderr, proc.stderr
    proc = galapagos("data", "check", tmp_path / "a.h5")
    assert proc.returncode == 0 and "warning:" in proc.stderr and "(30x)" in proc.stderr


def test_the_command_says_it_in_one_line(tmp_path):
    src = npz(tmp_path, RNG.random((40, 32, 32, 1), dtype=np.float32), np.arange(40) % 2)
    proc = galapagos("data", "import", src, tmp_path / "a.h5")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--channels-last" in proc.stderr
    proc = galapagos("data", "import", src, tmp_path / "a.h5", "--channels-last")
    assert proc.returncode == 0, proc.stderr
    assert "(1, 32, 32)" in proc.stdout or "1x32x32" in proc.stdout or "[1, 32, 32]" in proc.stdout, proc.stdout
