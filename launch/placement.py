"""Where a worker trains: its GPUs and an even share of the physical cores nearest them.

One module answers every question about the node, from files and environment variables only, so the MPI rank never
initialises CUDA, ROCm or Level Zero (the trainer child is the first to touch the device): which GPUs this process
may use (NVIDIA, AMD, Intel) and in which order the runtime numbers them, which CPUs are nearest each, which CPUs
are hardware threads of one physical core, and how the workers of a node split all that.

Everything that reads the machine takes a root directory, so the tests run it on recorded nodes
(tests/fixtures/topology/). Where a file is missing (macOS, a container without sysfs) the answer is "unknown"
and the cores are split in numeric order, as before.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

VENDORS = {"0x10de": "nvidia", "0x1002": "amd", "0x8086": "intel"}
DRIVERS = {"nvidia": ("nvidia",), "amd": ("amdgpu",), "intel": ("i915", "xe")}  # a GPU without one is not usable
GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")  # VGA, 3D, other display controller, processing accelerator


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu", "cuda:N" (NVIDIA, and AMD under ROCm, whose torch keeps the name) or "xpu:N" (Intel)
    cores: tuple[int, ...]  # the CPUs (hardware threads) the trainer child is bound to
    local_index: int  # this worker among the workers of its node
    local_workers: int
    threads: int = 1  # torch threads: the physical cores among `cores`, not their hardware threads
    devices: tuple[str, ...] = ()  # every device it owns, `device` first: more where a node has fewer worker ranks
    # than GPUs (worker j of w owns the neighbouring GPUs j*n//w .. (j+1)*n//w - 1), for run.spread (launch/spread.py)


@dataclass(frozen=True)
class Gpu:
    address: str = ""  # PCI address, "0000:c1:00.0"; "" where unknown
    cpus: frozenset[int] = frozenset()  # the CPUs nearest it; empty where unknown
    uuid: str = ""  # NVIDIA's "GPU-..." (CUDA_VISIBLE_DEVICES may name GPUs by it)
    tiles: int = 1  # Intel: the stacks of one card, each a device of its own in Level Zero's FLAT mode


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...] = ()  # this process's devices in the runtime's order: device N is gpus[N]
    kind: str = "cuda"  # torch's device type for them
    siblings: Mapping[int, frozenset[int]] = field(default_factory=dict)  # cpu -> the hardware threads of its core

    def core(self, cpu: int) -> int:
        """The physical core `cpu` belongs to, named by its lowest hardware thread."""
        return min(self.siblings.get(cpu, (cpu,)))


# -- reading the node ----------------------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def cpulist(text: str | None) -> list[int]:
    """'0-3,8,10-11' (the kernel's cpulist format) -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in (text or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            out.extend(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    return out


def _nearest(root: Path, address: str) -> frozenset[int]:
    """A PCI device's nearest CPUs: local_cpulist, else its NUMA node's cpulist, else unknown (empty)."""
    dev = root / "sys/bus/pci/devices" / address
    cpus = cpulist(_read(dev / "local_cpulist"))
    numa = _read(dev / "numa_node") or "-1"
    if not cpus and numa.isdigit():  # -1: the device has no NUMA node of its own
        cpus = cpulist(_read(root / f"sys/devices/system/node/node{numa}/cpulist"))
    return frozenset(cpus)


def _tiles(dev: Path) -> int:
    """Intel: the stacks of a card, from sysfs (xe: tileN under the device; i915: drm/cardN/gt/gtN)."""
    return max(1, len(list(dev.glob("tile[0-9]*"))), len(list(dev.glob("drm/card[0-9]*/gt/gt[0-9]*"))))


def _pci_gpus(root: Path) -> dict[str, list[Gpu]]:
    """The GPUs on the PCI bus with their vendor's compute driver bound, by vendor, in PCI address order.

    For identical GPUs CUDA and ROCm number devices in PCI bus order (Level Zero does with
    ZE_ENABLE_PCI_ID_DEVICE_ORDER=1, which ALCF's gpu_tile_compact.sh sets). /sys/class/drm cards and render
    nodes (drivers amdgpu, i915, xe) are these same PCI functions, so they are found here too.
    """
    found: dict[str, list[Gpu]] = {"nvidia": [], "amd": [], "intel": []}
    base = root / "sys/bus/pci/devices"
    try:
        addresses = sorted(os.listdir(base))
    except OSError:
        return found
    for address in addresses:
        dev = base / address
        vendor = VENDORS.get(_read(dev / "vendor") or "")
        if vendor is None or (_read(dev / "class") or "")[:6] not in GPU_CLASSES:
            continue
        try:
            driver = os.path.basename(os.readlink(dev / "driver"))
        except OSError:
            continue
        # Intel's integrated graphics is always 0000:00:02.0; a discrete card sits behind a root port, on a bus > 0.
        if driver not in DRIVERS[vendor] or (vendor == "intel" and address.split(":")[1] == "00"):
            continue
        found[vendor].append(Gpu(address, _nearest(root, address), tiles=_tiles(dev) if vendor == "intel" else 1))
    return found


def _nvidia_proc(root: Path) -> list[Gpu]:
    """NVIDIA's driver lists its GPUs in /proc/driver/nvidia/gpus/<PCI address>/information (with the UUID)."""
    base = root / "proc/driver/nvidia/gpus"
    try:
        addresses = sorted(os.listdir(base))
    except OSError:
        return []
    gpus = []
    for address in addresses:
        info = _read(base / address / "information") or ""
        uuid = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("GPU UUID")), "")
        gpus.append(Gpu(address, _nearest(root, address), uuid))
    return gpus


def _kfd(root: Path) -> list[Gpu]:
    """ROCm's view: KFD topology nodes with SIMDs are GPUs; domain and location_id give the PCI address."""
    gpus = []
    for props in (root / "sys/class/kfd/kfd/topology/nodes").glob("*/properties"):
        p = dict(line.split(None, 1) for line in (_read(props) or "").splitlines() if len(line.split()) == 2)
        if int(p.get("simd_count", 0)) > 0:
            loc = int(p.get("location_id", 0))
            address = f"{int(p.get('domain', 0)):04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1f:02x}.{loc & 7}"
            gpus.append(Gpu(address, _nearest(root, address)))
    return sorted(gpus, key=lambda g: g.address)


def _select(devices: list[Gpu], value: str) -> list[Gpu]:
    """The devices a *_VISIBLE_DEVICES list leaves, in its order: indices into `devices` (for NVIDIA nvidia-smi's
    order, which is PCI bus order), or UUIDs, abbreviated or not; an empty list leaves none. As CUDA does, an entry
    that names no device ("-1") hides it and every entry after it. Without a list of devices to index (no driver
    files here) each entry is a GPU of unknown locality.
    https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html
    """
    picked = []
    for token in (t.strip() for t in value.split(",")):
        named = [d for d in devices if d.uuid and token.startswith("GPU-") and d.uuid.startswith(token)]
        if token.isdigit() and (not devices or int(token) < len(devices)):
            picked.append(devices[int(token)] if devices else Gpu())
        elif named:
            picked.append(named[0])
        elif token.startswith("MIG-") or (token.startswith("GPU-") and not devices):
            picked.append(Gpu())  # a MIG instance, or a UUID with nothing to resolve it: a GPU, locality unknown
        else:
            break
    return picked


def _amd(devices: list[Gpu], env: Mapping[str, str]) -> list[Gpu]:
    """ROCm's visible devices. ROCR_VISIBLE_DEVICES (indices or UUIDs) selects among all GPUs at the ROCr runtime;
    then HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES, else GPU_DEVICE_ORDINAL) indexes what ROCr left.
    https://rocm.docs.amd.com/projects/HIP/en/latest/reference/env_variables.html (GPU isolation variables),
    https://rocm.docs.amd.com/en/docs-6.1.2/conceptual/gpu-isolation.html; Slurm on Frontier sets
    ROCR_VISIBLE_DEVICES; torch's ROCm build counts devices the same way (github.com/pytorch/pytorch/pull/142292).
    (ROCm UUIDs are not in sysfs: a UUID entry ends the list, as an unknown name does.)"""
    if "ROCR_VISIBLE_DEVICES" in env:
        devices = _select(devices, env["ROCR_VISIBLE_DEVICES"])
    name = next((n for n in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL") if n in env), None)
    return _select(devices, env[name]) if name else devices


def _intel(cards: list[Gpu], env: Mapping[str, str]) -> list[Gpu]:
    """Level Zero's devices: each stack (tile) of a card in FLAT mode (the default, and what ALCF's frameworks
    module sets on Aurora), each card in COMPOSITE mode. ZE_AFFINITY_MASK keeps the devices it names ("N", or
    "N.T" for stack T of card N in COMPOSITE mode), in device order; entries naming no device are ignored.
    https://www.intel.com/content/www/us/en/developer/articles/technical/flattening-gpu-tile-hierarchy.html,
    https://oneapi-src.github.io/level-zero-spec/level-zero/latest/core/PROG.html#environment-variables,
    https://docs.alcf.anl.gov/aurora/running-jobs-aurora/ (one rank per GPU tile, ZE_AFFINITY_MASK=gpu.tile)."""
    composite = env.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT").strip().upper() == "COMPOSITE"
    units = list(cards) if composite else [card for card in cards for _ in range(card.tiles)]
    if "ZE_AFFINITY_MASK" not in env:
        return units
    heads = {int(h) for t in env["ZE_AFFINITY_MASK"].split(",") if (h := t.strip().split(".")[0]).isdigit()}
    return [units[i] if units else Gpu() for i in sorted(heads) if not units or i < len(units)]


def read_siblings(root: str | os.PathLike = "/") -> dict[int, frozenset[int]]:
    """cpu -> the hardware threads of its physical core (thread_siblings_list); {} where sysfs has none."""
    siblings = {}
    for path in Path(root, "sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        if threads := cpulist(_read(path)):
            siblings[int(path.parent.parent.name[3:])] = frozenset(threads)
    return siblings


def read_topology(root: str | os.PathLike = "/", env: Mapping[str, str] | None = None) -> Topology:
    """This process's GPUs in device order, each with its nearest CPUs, and the node's hardware-thread siblings.

    The vendor whose GPUs are on the node decides which variables apply (Slurm may set them all): NVIDIA
    (CUDA_VISIBLE_DEVICES), else AMD (see _amd), else Intel (see _intel). With no GPU files at all,
    CUDA_VISIBLE_DEVICES alone still counts GPUs, as it always did.
    """
    root, env = Path(root), os.environ if env is None else env
    found = _pci_gpus(root)
    nvidia, amd = found["nvidia"] or _nvidia_proc(root), found["amd"] or _kfd(root)
    if nvidia:
        uuids = {g.address: g.uuid for g in _nvidia_proc(root)}  # CUDA_VISIBLE_DEVICES may name GPUs by UUID
        nvidia = [Gpu(g.address, g.cpus, uuids.get(g.address, "")) for g in nvidia]
        gpus = _select(nvidia, env["CUDA_VISIBLE_DEVICES"]) if "CUDA_VISIBLE_DEVICES" in env else nvidia
        kind = "cuda"
    elif amd:
        gpus, kind = _amd(amd, env), "cuda"  # torch's ROCm build names HIP devices "cuda"
    elif found["intel"]:
        gpus, kind = _intel(found["intel"], env), "xpu"
    else:
        gpus, kind = _select([], env.get("CUDA_VISIBLE_DEVICES", "")), "cuda"
    return Topology(tuple(gpus), kind, read_siblings(root))


def gpu_count() -> int:
    """GPUs visible to this process, without initialising any GPU runtime in the MPI rank."""
    return len(read_topology().gpus)


def allowed_cores() -> list[int]:
    """The cores this process may run on (its affinity where the system has one)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | tuple[int, ...], topology: Topology) -> list[tuple[int, ...]]:
    """`cpus` grouped by physical core (a core's hardware threads together), cores in order of their number."""
    groups: dict[int, list[int]] = {}
    for cpu in sorted(set(cpus)):
        groups.setdefault(topology.core(cpu), []).append(cpu)
    return [tuple(groups[k]) for k in sorted(groups)]


def core_count(cpus: list[int] | tuple[int, ...], root: str | os.PathLike = "/") -> int:
    """How many physical cores `cpus` span: the threads torch should run on them."""
    return max(1, len(physical_cores(cpus, Topology(siblings=read_siblings(root)))))


# -- splitting the node --------------------------------------------------------------------------------------------
def _share(cores: list[tuple[int, ...]], i: int, weights: list[int]) -> tuple[int, ...]:
    """Member i's share of `cores`, in order, among members weighted by their GPUs (an even share per GPU, so a
    worker with two GPUs takes what two workers with one each would): whole physical cores while there are enough
    for each member, else hardware threads, else (more members than threads) one thread each, round-robin. With
    fewer units than GPUs the members share evenly, so that none is left without."""
    m = len(weights)
    units = cores if m <= len(cores) else [(cpu,) for core in cores for cpu in core]
    if m > len(units):
        return units[i % len(units)]
    if sum(weights) > len(units):
        weights = [1] * m
    lo, total, u = sum(weights[:i]), sum(weights), len(units)
    return tuple(sorted(cpu for unit in units[lo * u // total:(lo + weights[i]) * u // total] for cpu in unit))


def _gpus(index: int, workers: int, n: int) -> range:
    """The GPUs (of n) worker `index` of `workers` owns. With fewer workers than GPUs, a block of neighbours,
    [index*n//workers, (index+1)*n//workers): device order is PCI order, so a block holds the two GCDs of one
    MI250X (Frontier) or the two tiles of one PVC (Aurora), and a spread group over it talks over the fastest
    links. Otherwise the GPU it shares with other workers, index % n."""
    if workers < n:
        return range(index * n // workers, (index + 1) * n // workers)
    return range(index % n, index % n + 1)


def _groups(cores: list[tuple[int, ...]], topology: Topology, workers: int) -> list[tuple[list, list[int]]] | None:
    """(the cores, the workers that split them) for each locality domain, or None where a worker's is unknown.

    The cores nearest a GPU are its domain; a group is the domains of GPUs whose domains overlap (two GCDs of one
    NUMA node) or whose owners overlap (a worker with several GPUs, several workers on one GPU): a worker's cores
    come from the domains of all its GPUs, shared with every other worker owning a GPU there. A group's workers are
    ordered by their first GPU and its cores by the first GPU nearest them, so each worker takes the cores nearest
    its own GPUs (on Frontier GCD 0 gets 49-55 and GCD 1 57-63 of NUMA node 3)."""
    n = len(topology.gpus)
    domains = [{c for c in cores if gpu.cpus.intersection(c)} for gpu in topology.gpus]
    mine = [_gpus(j, workers, n) for j in range(workers)]
    if not all(any(domains[k] for k in ks) for ks in mine):
        return None
    first = {c: k for k in reversed(range(n)) for c in domains[k]}  # each core's first GPU
    groups: list[tuple[set, set[int]]] = []  # (cores, workers)
    for k in range(n):
        owners = {j for j, ks in enumerate(mine) if k in ks}
        merged = [g for g in groups if g[0] & domains[k] or g[1] & owners]
        groups = [g for g in groups if g not in merged]
        groups.append((domains[k].union(*(g[0] for g in merged)), owners.union(*(g[1] for g in merged))))
    return [(sorted(c, key=lambda core: (first[core], core)), sorted(js, key=lambda j: (mine[j][0], j)))
            for c, js in groups]


def owned(index: int, workers: int, topology: Topology) -> tuple[str, ...]:
    """Worker `index`'s devices among `workers`: a block of neighbouring GPUs where the node has fewer workers than
    GPUs (worker j of w owns GPUs j*n//w up to (j+1)*n//w - 1 of n), else the GPU it shares, index % n; ("cpu",)
    without GPUs."""
    n = len(topology.gpus)
    if not n:
        return ("cpu",)
    return tuple(f"{topology.kind}:{k}" for k in _gpus(index, workers, n))


def place(local_index: int, local_workers: int, *, allowed: list[int] | None = None,
          topology: Topology | None = None) -> Placement:
    """Worker `local_index` of `local_workers`: the GPUs it owns (see owned) and an even share per GPU of the physical
    cores nearest them among `allowed` (those it may use; by default this process's). Workers whose GPUs share a
    locality domain split it; where the topology is unknown, or no allowed core is near a worker's GPUs, the allowed
    cores are split in numeric order. All hardware threads of a core go to one worker while every worker can
    have a whole core; with more workers than that, they share round-robin rather than leave any with none.
    """
    topology = read_topology() if topology is None else topology
    workers = max(1, local_workers)
    cores = physical_cores(allowed_cores() if allowed is None else allowed, topology)
    me, n = local_index % workers, len(topology.gpus)
    groups = _groups(cores, topology, workers) if n else None
    group = next((g for g in groups if me in g[1]), None) if groups else None
    among, members = (cores, list(range(workers))) if group is None else group
    share = _share(among, members.index(me), [len(_gpus(j, workers, n)) if n else 1 for j in members])
    devices = owned(me, workers, topology)
    return Placement(devices[0], share, local_index, local_workers, len({topology.core(c) for c in share}), devices)


def node_placement(node: Any, rank: int, takes_part: bool = True, topology: Topology | None = None
                   ) -> Placement | None:
    """Collective over `node` (the communicator of this node's ranks): this rank's placement among the ranks that
    take part (numbered in rank order), or None for a rank that takes none.

    When the launcher already bound those ranks to disjoint cores (srun --cpu-bind, jsrun resource sets, mpiexec
    --cpu-bind depth/list), each keeps its own; otherwise they split the cores all of them may use.
    """
    own = allowed_cores()
    active = [(r, set(c)) for r, c, part in sorted(node.allgather((rank, own, takes_part))) if part]
    if not takes_part:
        return None
    topology = read_topology() if topology is None else topology
    index, sets = [r for r, _ in active].index(rank), [c for _, c in active]
    if len(sets) > 1 and all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1:]):
        devices = owned(index, len(active), topology)
        return Placement(devices[0], tuple(own), index, len(active), len(physical_cores(own, topology)), devices)
    return place(index, len(active), allowed=sorted(set.intersection(*sets)) or own, topology=topology)
