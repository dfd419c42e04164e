"""Splitting a node between its workers."""
from launch.placement import place


def test_cores_split_evenly_and_disjoint():
    cores = list(range(16))
    shares = [place(i, 4, allowed=cores, gpus=0).cores for i in range(4)]
    assert [len(s) for s in shares] == [4, 4, 4, 4]
    assert sorted(c for s in shares for c in s) == cores
    assert all(place(i, 4, allowed=cores, gpus=0).device == "cpu" for i in range(4))


def test_uneven_split_covers_every_core():
    shares = [place(i, 3, allowed=list(range(8)), gpus=0).cores for i in range(3)]
    assert sorted(c for s in shares for c in s) == list(range(8))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_more_workers_than_cores_share_round_robin():
    shares = [place(i, 5, allowed=[2, 3], gpus=0).cores for i in range(5)]
    assert shares == [(2,), (3,), (2,), (3,), (2,)]


def test_one_gpu_per_worker_by_local_rank():
    assert [place(i, 6, allowed=list(range(42)), gpus=6).device for i in range(6)] == [f"cuda:{i}" for i in range(6)]
    assert place(0, 1, allowed=[0], gpus=1).device == "cuda:0"  # the launcher left one GPU visible to this rank
