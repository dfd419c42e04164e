"""Splitting a node between its workers: GPUs of every vendor in device order, the physical cores nearest each.

Recorded nodes (tests/fixtures/topology/*.json, a compact description) are expanded into a fake sysfs under
tmp_path, and the placement reads it as it would read /sys on the machine.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mpirun import describe_run, run_mpi

from galapagos.launch.placement import Gpu, Topology, cpulist, node_placement, place, read_topology

FIXTURES = Path(__file__).parent / "fixtures" / "topology"
NODES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _pci(root: Path, dev: dict, spec: dict, cpus: str) -> None:
    base = root / "sys/bus/pci/devices" / dev["address"]
    for name in ("vendor", "class"):
        _write(base / name, dev[name])
    _write(base / "numa_node", str(dev.get("numa", -1)))
    if spec.get("local_cpulist"):
        _write(base / "local_cpulist", cpus)
    os.symlink(f"../../../bus/pci/drivers/{dev['driver']}", base / "driver")
    for card in range(1 if dev.get("tiles") else 0):
        for tile in range(dev["tiles"]):
            (base / f"drm/card{card}/gt/gt{tile}").mkdir(parents=True)


def threads_of(spec: dict, cores: str) -> list[int]:
    """The hardware threads of the physical cores `cores` ("1-7,9") of a recorded node."""
    n, t = spec["cores"], spec["threads"]
    return sorted(c + i * n if spec["layout"] == "stride" else c * t + i for c in cpulist(cores) for i in range(t))


def node(tmp_path: Path, name: str, spec: dict | None = None) -> tuple[Path, dict, list[int]]:
    """A recorded node (or `spec`, described the same way) as a fake sysfs: (its root, its description, the CPUs a
    process there may use)."""
    spec = spec or json.loads((FIXTURES / f"{name}.json").read_text())
    root = tmp_path / name
    for core in range(spec["cores"]):
        threads = threads_of(spec, str(core))
        for cpu in threads:
            _write(root / f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", ",".join(map(str, threads)))
    numa_cpus = {k: ",".join(map(str, threads_of(spec, v))) for k, v in spec["numa"].items()}
    for k, cpus in numa_cpus.items():
        _write(root / f"sys/devices/system/node/node{k}/cpulist", cpus)
    for i, gpu in enumerate(spec["gpus"]):
        _pci(root, {**spec["gpu"], **gpu}, spec, numa_cpus[str(gpu["numa"])])
        if spec.get("nvidia_proc"):
            _write(root / f"proc/driver/nvidia/gpus/{gpu['address']}/information",
                   f"Model:\t\t NVIDIA A100\nGPU UUID:\t GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd")
    for dev in spec.get("others", []):
        _pci(root, dev, spec, numa_cpus[str(dev["numa"])])
    return root, spec, threads_of(spec, spec["allowed"])


def check_split(spec: dict, topo: Topology, allowed: list[int], workers: int) -> list:
    """The rules every split keeps; returns the placements."""
    shares = [place(i, workers, allowed=allowed, topology=topo) for i in range(workers)]
    used = [c for p in shares for c in p.cores]
    assert len(used) == len(set(used)), "shares overlap"
    assert set(used) <= set(allowed), "a core outside the allowed set"
    for i, p in enumerate(shares):
        gpu = i % len(topo.gpus)
        assert p.device == f"{spec['kind']}:{gpu}"
        nearest = set(threads_of(spec, spec["nearest"][gpu]))
        assert set(p.cores) <= nearest, f"worker {i} ({p.device}) has cores {p.cores} not nearest its GPU"
        whole = {c for cpu in p.cores for c in topo.siblings[cpu]} & set(allowed)
        assert whole == set(p.cores), f"worker {i} has part of a physical core"
        assert p.threads == len({topo.core(c) for c in p.cores}) == len(p.cores) // spec["threads"]
    return shares


@pytest.mark.parametrize("name", NODES)
def test_one_worker_per_gpu_gets_the_physical_cores_nearest_it(tmp_path, name):
    root, spec, allowed = node(tmp_path, name)
    topo = read_topology(root, env={})
    assert len(topo.gpus) == len(spec["nearest"])
    shares = check_split(spec, topo, allowed, len(topo.gpus))
    groups = {}  # GPUs nearest the same cores split them: together they take all of them
    for i, p in enumerate(shares):
        groups.setdefault(spec["nearest"][i], set()).update(p.cores)
    assert all(cores == set(threads_of(spec, near)) for near, cores in groups.items())


@pytest.mark.parametrize("name", NODES)
def test_two_workers_per_gpu_split_its_cores(tmp_path, name):
    root, spec, allowed = node(tmp_path, name)
    topo = read_topology(root, env={})
    check_split(spec, topo, allowed, 2 * len(topo.gpus))


def test_frontier_gcds_pair_with_their_l3_regions(tmp_path):
    root, spec, allowed = node(tmp_path, "frontier")
    topo = read_topology(root, env={})
    p = [place(i, 8, allowed=allowed, topology=topo) for i in range(8)]
    assert p[0].cores == tuple(range(49, 56)) + tuple(range(113, 120)) and p[0].threads == 7  # not the 0-7 of old
    assert p[4].cores == tuple(range(1, 8)) + tuple(range(65, 72))


# 8 GPUs in PCI order over 4 NUMA nodes of 8 cores (SMT2), two GPUs each: a node where order and locality agree
EIGHT = {"cores": 32, "threads": 2, "layout": "stride", "local_cpulist": True,
         "numa": {str(d): f"{8 * d}-{8 * d + 7}" for d in range(4)}, "allowed": "0-31",
         "gpus": [{"address": f"0000:{16 * (k + 1):02x}:00.0", "numa": k // 2} for k in range(8)],
         "gpu": {"vendor": "0x10de", "class": "0x030200", "driver": "nvidia"}, "kind": "cuda",
         "nearest": [f"{8 * (k // 2)}-{8 * (k // 2) + 7}" for k in range(8)]}


def check_blocks(spec: dict, topo: Topology, allowed: list[int], workers: int) -> list:
    """Fewer workers than GPUs: each owns a block of neighbouring GPUs and cores nearest them, no core is shared,
    and every allowed core near a GPU is someone's; returns the placements."""
    n = len(topo.gpus)
    shares = [place(i, workers, allowed=allowed, topology=topo) for i in range(workers)]
    assert [p.devices for p in shares] == [tuple(f"{spec['kind']}:{k}" for k in range(i * n // workers,
                                                                                       (i + 1) * n // workers))
                                           for i in range(workers)]
    assert all(p.device == p.devices[0] for p in shares)
    used = [c for p in shares for c in p.cores]
    assert len(used) == len(set(used)), "shares overlap"
    near = {k: set(threads_of(spec, spec["nearest"][k])) & set(allowed) for k in range(n)}
    assert set(used) == set().union(*near.values()), "a core near a GPU is left idle, or one near none is used"
    for i, p in enumerate(shares):
        mine = set().union(*(near[int(d.split(":")[1])] for d in p.devices))
        assert p.cores and set(p.cores) <= mine, f"worker {i} ({p.devices}) has cores {p.cores} not nearest its GPUs"
        assert {c for cpu in p.cores for c in topo.siblings[cpu]} & set(allowed) == set(p.cores), f"worker {i}: part"
        assert p.threads == len(p.cores) // spec["threads"]
    return shares


@pytest.mark.parametrize("name", NODES)
def test_fewer_workers_than_gpus_own_blocks_and_the_cores_of_all_their_gpus(tmp_path, name):
    root, spec, allowed = node(tmp_path, name)
    topo = read_topology(root, env={})
    for workers in range(1, len(topo.gpus)):
        check_blocks(spec, topo, allowed, workers)


def test_two_and_four_workers_on_eight_gpus_two_per_numa_node(tmp_path):
    root, spec, allowed = node(tmp_path, "eight", EIGHT)
    topo = read_topology(root, env={})
    two = check_blocks(spec, topo, allowed, 2)
    assert two[0].devices == ("cuda:0", "cuda:1", "cuda:2", "cuda:3") and two[1].device == "cuda:4"
    assert [(p.cores, p.threads) for p in two] == [(tuple(threads_of(spec, "0-15")), 16),
                                                   (tuple(threads_of(spec, "16-31")), 16)]
    four = check_blocks(spec, topo, allowed, 4)
    assert [p.devices for p in four] == [(f"cuda:{2 * j}", f"cuda:{2 * j + 1}") for j in range(4)]
    assert [p.cores for p in four] == [tuple(threads_of(spec, f"{8 * j}-{8 * j + 7}")) for j in range(4)]


def test_three_workers_on_eight_gpus_split_the_numa_node_two_of_them_share(tmp_path):
    root, spec, allowed = node(tmp_path, "eight", EIGHT)
    topo = read_topology(root, env={})
    three = check_blocks(spec, topo, allowed, 3)  # GPUs 0-1, 2-4, 5-7: GPUs 4 and 5 share NUMA node 2
    assert [len(p.devices) for p in three] == [2, 3, 3]
    assert [p.cores for p in three] == [tuple(threads_of(spec, c)) for c in ("0-7", "8-19", "20-31")]
    root, spec, allowed = node(tmp_path, "frontier")  # GCD order is not NUMA order: 0-1 NUMA 3, 2-3 1, 4-5 0, 6-7 2
    topo = read_topology(root, env={})
    three = check_blocks(spec, topo, allowed, 3)
    assert [p.cores for p in three] == [tuple(threads_of(spec, c)) for c in ("49-55,57-63", "1-7,17-23,25-31",
                                                                             "9-15,33-39,41-47")]
    assert [p.cores for p in check_blocks(spec, topo, allowed, 2)] == [
        tuple(threads_of(spec, "17-23,25-31,49-55,57-63")), tuple(threads_of(spec, "1-7,9-15,33-39,41-47"))]


def test_a_worker_with_more_gpus_takes_more_cores(tmp_path):
    root, spec, allowed = node(tmp_path, "frontier")  # 5 workers: GCDs 0, 1-2, 3, 4-5, 6-7; one L3 region per GCD
    topo = read_topology(root, env={})
    five = check_blocks(spec, topo, allowed, 5)
    assert [p.cores for p in five] == [tuple(threads_of(spec, c)) for c in ("49-55", "17-23,57-63", "25-31",
                                                                            "1-7,9-15", "33-39,41-47")]
    unknown = Topology(gpus=(Gpu(),) * 4)  # no locality: the cores in numeric order, still a share per GPU
    assert [place(i, 3, allowed=list(range(8)), topology=unknown).cores for i in range(3)] == [(0, 1), (2, 3),
                                                                                               (4, 5, 6, 7)]


def test_rocr_visible_devices_selects_and_hip_indexes_what_is_left(tmp_path):
    root, spec, allowed = node(tmp_path, "frontier")
    topo = read_topology(root, env={"ROCR_VISIBLE_DEVICES": "4,5"})
    assert [g.address for g in topo.gpus] == ["0000:d1:00.0", "0000:d6:00.0"] and topo.kind == "cuda"
    p = [place(i, 2, allowed=allowed, topology=topo) for i in range(2)]
    assert [x.device for x in p] == ["cuda:0", "cuda:1"]
    assert p[0].cores == tuple(threads_of(spec, "1-7")) and p[1].cores == tuple(threads_of(spec, "9-15"))
    for env in ({"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "0"},
                {"ROCR_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "0"}, {"HIP_VISIBLE_DEVICES": "1"}):
        assert [g.address for g in read_topology(root, env=env).gpus] == ["0000:c6:00.0"], env
    assert read_topology(root, env={"ROCR_VISIBLE_DEVICES": ""}).gpus == ()


def test_cuda_visible_devices_reorders_and_stops_at_an_invalid_entry(tmp_path):
    root, spec, allowed = node(tmp_path, "perlmutter")
    topo = read_topology(root, env={"CUDA_VISIBLE_DEVICES": "3,0"})
    assert [g.address for g in topo.gpus] == ["0000:c1:00.0", "0000:03:00.0"]
    assert place(0, 2, allowed=allowed, topology=topo).cores == tuple(threads_of(spec, "0-15"))  # GPU 3: NUMA 0
    assert len(read_topology(root, env={"CUDA_VISIBLE_DEVICES": "1,-1,2"}).gpus) == 1
    assert read_topology(root, env={"CUDA_VISIBLE_DEVICES": ""}).gpus == ()
    by_uuid = read_topology(root, env={"CUDA_VISIBLE_DEVICES": "GPU-00000002"})  # a UUID prefix names a GPU
    assert [g.address for g in by_uuid.gpus] == ["0000:82:00.0"]
    assert place(0, 1, allowed=allowed, topology=Topology()).device == "cpu"


def test_intel_tiles_are_xpu_devices(tmp_path):
    root, spec, allowed = node(tmp_path, "aurora")
    flat = read_topology(root, env={})
    assert flat.kind == "xpu" and len(flat.gpus) == 12
    assert place(7, 12, allowed=allowed, topology=flat).device == "xpu:7"
    assert len(read_topology(root, env={"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}).gpus) == 6
    one = read_topology(root, env={"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "3.1"})
    assert [g.address for g in one.gpus] == ["0001:18:00.0"]  # ALCF's gpu_tile_compact.sh: one tile per rank
    assert set(place(0, 1, allowed=allowed, topology=one).cores) == set(threads_of(spec, "53-103"))
    two = read_topology(root, env={"ZE_AFFINITY_MASK": "6,7"})  # FLAT: tiles 0 and 1 of card 3
    assert [g.address for g in two.gpus] == ["0001:18:00.0"] * 2


def test_integrated_and_driverless_gpus_do_not_count(tmp_path):
    root = tmp_path / "laptop"
    for address, vendor, cls, driver in (("0000:00:02.0", "0x8086", "0x030000", "i915"),  # Intel integrated
                                         ("0000:01:00.0", "0x10de", "0x030000", "nouveau"),  # no CUDA driver
                                         ("0000:02:00.0", "0x1a03", "0x030000", "ast")):  # a BMC's VGA
        _pci(root, {"address": address, "vendor": vendor, "class": cls, "driver": driver}, {}, "")
    assert read_topology(root, env={}).gpus == ()


def test_driver_files_when_sysfs_lists_no_pci_devices(tmp_path):
    nv = tmp_path / "nv"
    _write(nv / "proc/driver/nvidia/gpus/0000:3b:00.0/information", "GPU UUID:\t GPU-1234")
    assert [(g.address, g.uuid) for g in read_topology(nv, env={}).gpus] == [("0000:3b:00.0", "GPU-1234")]
    amd = tmp_path / "amd"
    _write(amd / "sys/class/kfd/kfd/topology/nodes/0/properties", "cpu_cores_count 64\nsimd_count 0")
    _write(amd / "sys/class/kfd/kfd/topology/nodes/1/properties", f"simd_count 440\nlocation_id {0xd1 << 8}\ndomain 0")
    topo = read_topology(amd, env={})
    assert [g.address for g in topo.gpus] == ["0000:d1:00.0"] and topo.kind == "cuda"


def test_unknown_topology_splits_the_cores_in_numeric_order(tmp_path):
    topo = read_topology(tmp_path / "nothing", env={"CUDA_VISIBLE_DEVICES": "0,1"})  # as before: trusted
    assert topo.gpus == (Gpu(), Gpu())
    shares = [place(i, 4, allowed=list(range(16)), topology=topo) for i in range(4)]
    assert [p.cores for p in shares] == [tuple(range(4 * i, 4 * i + 4)) for i in range(4)]
    assert [p.device for p in shares] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert read_topology(tmp_path / "nothing", env={}).gpus == ()


def test_cores_split_evenly_and_disjoint():
    cores = list(range(16))
    shares = [place(i, 4, allowed=cores, topology=Topology()).cores for i in range(4)]
    assert [len(s) for s in shares] == [4, 4, 4, 4]
    assert sorted(c for s in shares for c in s) == cores
    assert all(place(i, 4, allowed=cores, topology=Topology()).device == "cpu" for i in range(4))


def test_uneven_split_covers_every_core():
    shares = [place(i, 3, allowed=list(range(8)), topology=Topology()).cores for i in range(3)]
    assert sorted(c for s in shares for c in s) == list(range(8))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_more_workers_than_cores_share_round_robin():
    shares = [place(i, 5, allowed=[2, 3], topology=Topology()).cores for i in range(5)]
    assert shares == [(2,), (3,), (2,), (3,), (2,)]


def test_hardware_threads_of_a_core_stay_together_on_a_cpu_node():
    siblings = {c: frozenset({c % 4, c % 4 + 4}) for c in range(8)}  # 4 cores, SMT2: c and c+4
    shares = [place(i, 2, allowed=list(range(8)), topology=Topology(siblings=siblings)) for i in range(2)]
    assert [(p.cores, p.threads) for p in shares] == [((0, 1, 4, 5), 2), ((2, 3, 6, 7), 2)]
    many = [place(i, 8, allowed=list(range(8)), topology=Topology(siblings=siblings)).cores for i in range(8)]
    assert sorted(c for s in many for c in s) == list(range(8))  # more workers than cores: one thread each


def test_gpu_device_types_in_the_trainer_and_training():
    import torch

    from galapagos.evolve.steps import autocast_for as _autocast_for
    from galapagos.launch.trainer import _usable_device

    assert _autocast_for(torch.device("xpu:1"), True)[0] in (torch.bfloat16, torch.float16)  # mixed precision
    assert _autocast_for(torch.device("cpu"), True)[0] is None
    assert _usable_device("cpu") == "cpu"
    assert _usable_device("cuda:0") == ("cuda:0" if torch.cuda.is_available() else "cpu")  # CPU-only torch
    assert _usable_device("xpu:0") == ("xpu:0" if torch.xpu.is_available() else "cpu")


class FakeNode:
    """A node communicator for node_placement without MPI: allgather returns what every rank would send."""

    def __init__(self, affinities: dict[int, list[int]], me: int):
        self.affinities, self.me = affinities, me

    def allgather(self, mine):
        return [mine if r == mine[0] else (r, cores, r != 0) for r, cores in self.affinities.items()]


def test_launcher_bound_ranks_keep_their_cores(monkeypatch):
    bound = {0: [0, 1], 1: [2, 3, 10, 11], 2: [4, 5, 12, 13]}  # e.g. srun --cpu-bind: disjoint per worker
    siblings = Topology(siblings={c: frozenset({c % 8, c % 8 + 8}) for c in range(16)})
    for rank in (1, 2):
        monkeypatch.setattr("galapagos.launch.placement.allowed_cores", lambda r=rank: bound[r])
        p = node_placement(FakeNode(bound, rank), rank, True, topology=siblings)
        assert (p.cores, p.local_index, p.local_workers, p.threads) == (tuple(bound[rank]), rank - 1, 2, 2)
    monkeypatch.setattr("galapagos.launch.placement.allowed_cores", lambda: list(range(16)))
    shared = {r: list(range(16)) for r in range(3)}
    assert node_placement(FakeNode(shared, 0), 0, False, topology=siblings) is None  # the master takes none
    p = node_placement(FakeNode(shared, 2), 2, True, topology=siblings)
    assert p.cores == (4, 5, 6, 7, 12, 13, 14, 15) and p.threads == 4


REAL = """
import json, os
from galapagos.launch.mpi import node_comm, world
from galapagos.launch.session import _placement
from galapagos.flows.prediction import _device
comm = world()
own = sorted(os.sched_getaffinity(0))
node = node_comm(comm)
p = _placement(comm, node)
node.Free()
device = _device(comm, 2)
mine = {"rank": comm.rank, "own": own, "cores": p and list(p.cores), "device": device,
        "after": sorted(os.sched_getaffinity(0))}
everyone = comm.gather(mine, root=0)
if comm.rank == 0:
    print("RESULT " + json.dumps(everyone), flush=True)
"""


def _real(binding: str | None) -> dict[int, dict]:
    env = {"CUDA_VISIBLE_DEVICES": "", "ZE_AFFINITY_MASK": "", "ROCR_VISIBLE_DEVICES": ""}  # CPUs only
    if binding:
        env["HYDRA_BINDING"] = binding  # MPICH's mpiexec binds each rank to a core of its own
    proc = run_mpi(3, ["-c", REAL], timeout=120, env=env)
    assert proc.returncode == 0, describe_run(proc)
    out = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(out) == 1, describe_run(proc)
    return {r["rank"]: r for r in out[0]}


@pytest.mark.mpi
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_real_ranks_bound_by_the_launcher_keep_their_cores():
    r = _real("core")
    if not (set(r[1]["own"]).isdisjoint(r[2]["own"]) and set(r[0]["own"]).isdisjoint(r[1]["own"])):
        pytest.skip(f"this mpiexec did not bind the ranks to cores of their own: {r}")
    assert r[0]["cores"] is None  # the master: no worker share
    assert r[1]["cores"] == r[1]["own"] and r[2]["cores"] == r[2]["own"]  # session._placement kept them
    assert r[0]["after"] == r[0]["own"] and r[1]["after"] == r[1]["own"]  # inference._device too
    assert r[2]["device"] == "cpu"  # no member: idle


@pytest.mark.mpi
@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_real_unbound_ranks_split_the_node():
    r = _real(None)
    assert r[1]["own"] == r[2]["own"]
    assert r[1]["cores"] and r[2]["cores"] and set(r[1]["cores"]).isdisjoint(r[2]["cores"])
    assert set(r[1]["cores"]) | set(r[2]["cores"]) == set(r[1]["own"])
    assert set(r[0]["after"]).isdisjoint(r[1]["after"])  # the two ranks with members split it for inference


def test_parallel_test_processes_get_disjoint_core_slices_of_at_least_four():
    from tests.conftest import MIN_TEST_CORES, worker_cores

    cores = list(range(16))
    shares = [worker_cores(cores, i, 4) for i in range(4)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    uneven = [worker_cores(list(range(2, 13)), i, 2) for i in range(2)]  # 11 cores, not from 0
    assert uneven == [[2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    assert worker_cores(cores, 0, 5) is None  # 3 cores each: share the machine instead
    assert worker_cores(list(range(2)), 0, 2) is None and worker_cores(cores, 0, 1) is None
    assert MIN_TEST_CORES == 4
