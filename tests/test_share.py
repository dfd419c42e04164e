"""Read once, two-level broadcast, one shared copy per node: datashare.share over real MPI ranks.

GALAPAGOS_RANKS_PER_NODE makes one machine look like several nodes, so the leader-to-leader paths (broadcast,
point-to-point subsets, checksums) run for real.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpirun import assert_ranks, describe_run, run_mpi

from galapagos.datashare.shm import remove_stale
from galapagos.datashare.write import write_dataset

SCRIPT = Path(__file__).parent / "mpi_scripts" / "share_check.py"
pytestmark = pytest.mark.mpi


def _run(n: int, per_node: int, *args: str, timeout: float = 120):
    return run_mpi(n, [SCRIPT, *args], timeout=timeout, env={"GALAPAGOS_RANKS_PER_NODE": str(per_node)})


@pytest.mark.parametrize("n,per_node,readers", [(2, 2, "1"), (4, 1, "1"), (4, 2, "node"), (3, 1, "2")],
                         ids=["one-node", "four-nodes", "two-nodes-every-leader-reads", "three-nodes-two-readers"])
def test_every_dtype_and_rank_bit_exact_on_every_rank(n, per_node, readers):
    assert_ranks(_run(n, per_node, "exact", "--readers", readers), n, "CASE_OK")


def _dataset(path: Path, compression: str | None) -> str:
    rng = np.random.default_rng(5)
    write_dataset(path, {"train": (rng.standard_normal((301, 2, 5, 3)).astype("float32"), rng.integers(0, 4, 301)),
                         "test": (rng.standard_normal((57, 2, 5, 3)).astype("float32"), rng.integers(0, 4, 57))},
                  task="classification", num_classes=4, compression=compression)
    return str(path)


@pytest.mark.parametrize("compression", [None, "gzip"], ids=["contiguous-read-raw", "compressed-read-by-hdf5"])
def test_file_read_by_every_node_leader_matches_a_plain_load_with_carved_val(tmp_path, compression):
    from galapagos.datashare.plan import dataset_plan

    path = _dataset(tmp_path / "d.h5", compression)
    raw = [s.offset is not None for s in dataset_plan(path, ("train", "test"))[0].sources]
    assert all(raw) if compression is None else not any(raw)
    assert_ranks(_run(4, 2, "file", "--file", path), 4, "CASE_OK")


def test_subsets_reach_only_the_nodes_that_ask():
    assert_ranks(_run(4, 2, "subset"), 4, "CASE_OK")


@pytest.mark.parametrize("kind", ["xxh3-64", "crc32"], ids=["xxh3", "crc32-fallback"])
def test_corrupted_piece_is_an_error_naming_piece_and_rank_on_every_rank(kind):
    proc = _run(3, 1, "corrupt", "--checksum", kind)
    assert sorted(re.findall(r"SHARE_ERROR rank=(\d+):", proc.stdout)) == ["0", "1", "2"], describe_run(proc)
    assert proc.stdout.count("piece 0 (x rows 0:1024, read by rank 0) arrived corrupted on rank 2") == 3
    assert f"{kind} checksum mismatch in 1 of 1 block(s), the first covering bytes 0:8192 of the piece" in proc.stdout
    assert "CASE_OK" not in proc.stdout


def test_a_rank_without_xxhash_refuses_the_pieces_it_cannot_verify():
    proc = _run(3, 1, "corrupt", "--checksum", "missing")
    assert sorted(re.findall(r"SHARE_ERROR rank=(\d+):", proc.stdout)) == ["0", "1", "2"], describe_run(proc)
    assert ("piece 0 (x rows 0:1024, read by rank 0) cannot be verified on rank 2 (" in proc.stdout
            and "checksum 'xxh3-64' needs the xxhash package, which this rank lacks (pip install xxhash)"
            in proc.stdout), describe_run(proc)


@pytest.mark.parametrize("kind", ["xxh3-64", "crc32"])
def test_checksum_names_the_one_corrupted_block(kind):
    from galapagos.datashare.checksums import CRC_BLOCK, checksum

    buf = np.random.default_rng(3).integers(0, 256, 3 * CRC_BLOCK + 5, dtype=np.uint8)
    clean = checksum(buf, kind)
    buf[2 * CRC_BLOCK + 17] ^= 0x01
    bad = checksum(buf, kind)
    assert len(clean) == 4 and [i for i, (c, b) in enumerate(zip(clean, bad)) if c != b] == [2]
    assert checksum(buf[:0], kind) == checksum(np.zeros(0, np.uint8), kind)


def test_bad_values_found_by_the_reader_stop_every_rank(tmp_path):
    path = tmp_path / "nan.h5"
    x = np.ones((40, 3), np.float32)
    x[33, 1] = np.nan
    with h5py.File(path, "w") as f:
        f.attrs["task"], f.attrs["num_classes"] = "classification", 2
        f["train/x"], f["train/y"] = x, np.zeros(40, np.int64)
    proc = _run(3, 1, "nan", "--file", str(path))
    assert sorted(re.findall(r"SHARE_ERROR rank=(\d+):", proc.stdout)) == ["0", "1", "2"], describe_run(proc)
    assert "/train/x: non-finite value (nan) in sample 33" in proc.stdout


def _segments(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix + "_")]


@pytest.mark.parametrize("when", ["after", "during"])
def test_a_killed_rank_leaves_no_shared_memory_behind(when):
    prefix = f"galapagostest{os.getpid()}{when}"
    proc = _run(4, 2, "crash", "--prefix", prefix, "--when", when, timeout=90)
    assert proc.returncode != 0, describe_run(proc)
    if when == "after":  # names are removed as soon as every rank mapped the data: nothing can leak
        assert "CRASHING rank=3" in proc.stdout, describe_run(proc)
        assert _segments(prefix) == []
    else:  # killed mid-transfer, before the names went: the next start removes what dead creators left
        assert "CRASHING" not in proc.stdout, describe_run(proc)
        left = _segments(prefix)
        assert left, "expected the segments of the killed job to be there still"
        assert sorted(remove_stale(prefix)) == sorted(left)
        assert _segments(prefix) == []


@pytest.mark.slow
def test_array_over_4_gib_between_two_nodes(tmp_path):
    from galapagos.datashare.shm import free_bytes

    path = tmp_path / "big.h5"
    rows, row = 4300, 1 << 20  # 4.2 GiB of uint8: past both 2**31 and 2**32 bytes, read by one reader
    if free_bytes() < 2 * rows * row + (1 << 30):
        pytest.skip(f"/dev/shm has {free_bytes() / 2**30:.1f} GiB free; two nodes' copies need "
                    f"{2 * rows * row / 2**30:.1f} GiB")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("big", (rows, row), np.uint8)
        block = 200
        for a in range(0, rows, block):
            b = min(rows, a + block)
            d[a:b] = (np.arange(a * row, b * row, dtype=np.int64) % 251).astype(np.uint8).reshape(b - a, row)
    assert_ranks(_run(2, 1, "large", "--file", str(path), timeout=300), 2, "CASE_OK")


def test_evolve_on_a_file_with_a_nan_stops_with_one_line_and_code_2(tmp_path):
    from test_evolve_run import galapagos

    path = tmp_path / "nan.h5"
    x = np.ones((60, 1, 4, 4), np.float32)
    x[41, 0, 1, 1] = np.nan
    with h5py.File(path, "w") as f:
        f.attrs["task"], f.attrs["num_classes"] = "classification", 2
        f["train/x"], f["train/y"] = x, np.zeros(60, np.int64)
    proc = galapagos("evolve", "--data", path, "--out", tmp_path / "run", "--evaluations", 2, "--workers", 2)
    assert proc.returncode == 2, describe_run(proc)
    assert f"{path}: /train/x: non-finite value (nan) in sample 41" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
