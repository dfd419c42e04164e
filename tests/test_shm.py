"""The packed layout of arrays, and shared-memory holders across real processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mpirun import REPO, describe_run

from galapagos.datashare.layout import ALIGN, layout, specs_of, views
from galapagos.datashare.shm import SharedArrays

# ---------------------------------------------------------------------------------------------- layout

def test_layout_aligns_every_array_and_packs_in_order() -> None:
    specs = [("a", (3,), "u1"), ("b", (2, 2), "<f8"), ("c", (0,), "f4"), ("d", (), "f2")]
    offsets, total = layout(specs)
    assert offsets == {"a": 0, "b": 64, "c": 128, "d": 128}
    assert total == 130
    assert all(o % ALIGN == 0 for o in offsets.values())
    with pytest.raises(ValueError, match="duplicate"):
        layout([("a", (1,), "f4"), ("a", (2,), "f4")])
    with pytest.raises(ValueError, match="objects"):
        layout([("o", (1,), object)])


def test_views_place_arrays_at_layout_offsets() -> None:
    arrays = {"x": np.arange(10, dtype=np.float32).reshape(2, 5), "y": np.arange(3, dtype=np.int64)}
    specs = specs_of(arrays)
    offsets, total = layout(specs)
    buf = np.zeros(total, np.uint8)
    v = views(buf, specs)
    for k, a in arrays.items():
        v[k][...] = a
        assert v[k].ctypes.data - buf.ctypes.data == offsets[k]
        np.testing.assert_array_equal(v[k], a)
    with pytest.raises(ValueError, match="needed"):
        views(np.zeros(total - 1, np.uint8), specs)


# ---------------------------------------------------------------------------------------------- shared memory

SPECS = [("x", (50, 1, 4, 4), "float32"), ("y", (50,), "int64"), ("h", (7, 3), "float16"), ("e", (0, 2), "uint8")]


def _fill(sa: SharedArrays, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    for k, a in sa.arrays.items():
        a[...] = rng.integers(0, 200, a.shape).astype(a.dtype)
    return {k: a.copy() for k, a in sa.arrays.items()}


def _child_attach(descriptor: dict, conn) -> None:  # runs in a spawned process
    try:
        sa = SharedArrays.attach(descriptor)
        result = {k: (a.dtype.str, a.shape, a.tobytes(), a.flags.writeable) for k, a in sa.arrays.items()}
        try:
            sa.arrays["x"][0] = 1.0
            result["write"] = "allowed"
        except ValueError:
            result["write"] = "refused"
        try:
            sa.unlink()
            result["unlink"] = "allowed"
        except PermissionError:
            result["unlink"] = "refused"
        sa.close()
        conn.send(result)
    except BaseException as e:  # report instead of dying silently
        conn.send({"error": repr(e)})
    finally:
        conn.close()


def test_shared_arrays_attach_read_only_from_spawned_child() -> None:
    sa = SharedArrays.create(SPECS, prefix="galapagos_test")
    path = Path("/dev/shm") / sa.name
    try:
        assert "galapagos_test" in sa.name and str(os.getpid()) in sa.name
        assert path.exists()
        want = _fill(sa)
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child_attach, args=(sa.descriptor(), child))
        p.start()
        child.close()
        assert parent.poll(60), "child did not answer"
        result = parent.recv()
        p.join(30)
        assert p.exitcode == 0
        assert "error" not in result, result
        assert result.pop("write") == "refused"
        assert result.pop("unlink") == "refused"
        for k, a in want.items():
            dtype, shape, raw, writeable = result[k]
            assert (np.dtype(dtype), shape, raw, writeable) == (a.dtype, a.shape, a.tobytes(), False), k
        # the child's exit must not have removed the segment (it shares this process's resource tracker)
        assert path.exists()
        np.testing.assert_array_equal(sa.arrays["x"], want["x"])
    finally:
        sa.close()
    assert not path.exists()


def test_attach_from_separate_interpreter_leaves_segment_and_no_warnings() -> None:
    with SharedArrays.create(SPECS, prefix="galapagos_test") as sa:
        want = _fill(sa, seed=3)
        code = textwrap.dedent(f"""
            from galapagos.datashare.shm import SharedArrays
            sa = SharedArrays.attach({sa.descriptor()!r})
            print("SUM", sa.arrays["y"].sum(), sa.arrays["x"].flags.writeable)
            sa.close()
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              cwd=REPO)
        assert proc.returncode == 0, describe_run(proc)
        assert f"SUM {want['y'].sum()} False" in proc.stdout
        assert proc.stderr == "", proc.stderr  # no resource_tracker "leaked shared_memory" warning
        assert (Path("/dev/shm") / sa.name).exists()
        name = sa.name
    assert not (Path("/dev/shm") / name).exists()


def test_views_survive_close_and_zero_size_segments_work() -> None:
    sa = SharedArrays.create([("e", (0,), "float32"), ("s", (), "float64")])
    sa.arrays["s"][()] = 2.5
    view = sa.arrays["s"]
    att = SharedArrays.attach(sa.descriptor())
    assert att.arrays["e"].shape == (0,) and float(att.arrays["s"]) == 2.5
    att.close()
    sa.close()
    sa.close()  # idempotent
    assert float(view) == 2.5  # the mapping lives on with the view instead of dangling
    assert not (Path("/dev/shm") / sa.name).exists()
    with pytest.raises(ValueError, match="closed"):
        sa.arrays

    empty = SharedArrays.create([])
    assert empty.nbytes == 0 and empty.arrays == {}
    empty.close()


def test_local_arrays_copy_into_shared_memory() -> None:
    src = {"a": np.arange(12.0).reshape(3, 4)[:, ::2], "b": np.array([1, 2, 3], np.uint8)}
    with SharedArrays.create(specs_of(src)) as sa:
        for k, a in src.items():
            sa.arrays[k][...] = a
        for k, a in src.items():
            np.testing.assert_array_equal(sa.arrays[k], a)
            assert sa.arrays[k].flags.writeable and sa.arrays[k].flags.c_contiguous


def test_remove_stale_unlinks_segments_of_dead_processes_only(tmp_path):
    import subprocess

    from galapagos.datashare.shm import remove_stale

    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"galapagos_{dead.pid}_dead", f"galapagos_{os.getpid()}_live", "other_1_x"):
        (tmp_path / name).write_bytes(b"x")
    assert remove_stale(directory=str(tmp_path)) == [f"galapagos_{dead.pid}_dead"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"galapagos_{os.getpid()}_live", "other_1_x"])


def test_too_little_shared_memory_is_refused_before_allocating_with_the_numbers() -> None:
    from galapagos.datashare.shm import SharedMemoryError, free_bytes, segment_stem

    huge = free_bytes() + (1 << 40)
    with pytest.raises(SharedMemoryError, match=r"/dev/shm has [\d.]+ GiB free, the dataset needs [\d.]+ GiB"):
        SharedArrays.create([("x", (huge,), "uint8")], prefix="galapagos_test")
    mine = segment_stem("galapagos_test", os.getpid())  # only this test's: tests running meanwhile make theirs
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(mine)]


def test_child_maps_segment_through_inherited_descriptor_after_the_name_is_gone() -> None:
    with SharedArrays.create(SPECS, prefix="galapagos_test") as sa:
        want = _fill(sa, seed=5)
        d = sa.descriptor()
        sa.unlink()
        assert not (Path("/dev/shm") / sa.name).exists()
        code = textwrap.dedent(f"""
            from galapagos.datashare.shm import SharedArrays
            sa = SharedArrays.attach({d!r})
            print("SUM", sa.arrays["y"].sum())
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                              pass_fds=[d["fd"]])
        assert proc.returncode == 0, describe_run(proc)
        assert f"SUM {want['y'].sum()}" in proc.stdout
