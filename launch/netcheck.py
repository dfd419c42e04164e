"""The network between nodes: which fabric a node has, which transport the MPI library will use on it, and how fast
it is (`galapagos doctor --ranks N`: node-to-node bandwidth and latency between the first rank of each node).

Run as ``python -m galapagos.launch.netcheck RESULT.json`` under mpiexec (what doctor starts when it is not under a
launcher), rank 0 writes the measurement to RESULT.json.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What one NIC of each fabric gives node to node (GB/s, small-message us), where the site profile does not say:
# Slingshot-11 200 Gb/s (https://docs.olcf.ornl.gov/systems/frontier_user_guide.html#system-overview), HDR
# InfiniBand 200 Gb/s, EFA 100 Gb/s on most instances (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html).
FABRICS = {"cxi": ("Slingshot-11", 25.0, 2.5), "infiniband": ("InfiniBand", 25.0, 1.5), "efa": ("EFA", 12.5, 15.0)}
TCP_GBS = 2.5  # what MPI over kernel TCP reaches on one stream: ~1-3 GB/s (the cost is ~bandwidth / 2.5)


def node_fabric(root: str | os.PathLike = "/") -> tuple[str, list[str]]:
    """The fast fabric this node has, from sysfs: "cxi" (HPE Slingshot NICs, /sys/class/cxi), "efa" (AWS EFA, an
    RDMA device bound to the efa driver), "infiniband" (any other RDMA device: mlx5, hfi1, irdma), else "none"."""
    sys_class = Path(root, "sys/class")
    cxi = sorted(p.name for p in (sys_class / "cxi").glob("*")) if (sys_class / "cxi").is_dir() else []
    if cxi:
        return "cxi", cxi
    rdma = sorted((sys_class / "infiniband").glob("*")) if (sys_class / "infiniband").is_dir() else []
    if not rdma:
        return "none", []
    names = [p.name for p in rdma]
    efa = [p.name for p in rdma if p.name.startswith("efa") or _driver(p / "device") == "efa"]
    return ("efa", efa) if efa else ("infiniband", names)


def _driver(dev: Path) -> str:
    try:
        return os.path.basename(os.readlink(dev / "driver"))
    except OSError:
        return ""


def _providers(libfabric: str) -> set[str]:
    """The libfabric providers built as plugins beside a libfabric.so (libfabric/lib<name>-fi.so): the pip wheel
    ships efa, psmx2 and verbs this way, and no cxi."""
    if not libfabric:
        return set()
    folder = Path(libfabric).parent / "libfabric"
    return {p.name[3:-6] for p in folder.glob("lib*-fi.so")} if folder.is_dir() else set()


def transport(lib: dict, env: Mapping[str, str], fabric: str) -> tuple[str, str]:
    """The transport the library will use between nodes, and how that was decided: MPICH's netmod
    (MPIR_CVAR_CH4_NETMOD, else the first its "MPICH Device" line names), then libfabric's FI_PROVIDER or UCX's
    UCX_TLS; Open MPI's OMPI_MCA_pml; Cray MPICH's libfabric (cxi on Slingshot). UCX has no Slingshot transport
    (https://docs.cscs.ch/software/communication/libfabric/)."""
    kind = lib["kind"]
    provider = env.get("FI_PROVIDER") or env.get("MPIR_CVAR_OFI_USE_PROVIDER") or env.get("I_MPI_OFI_PROVIDER")
    if kind in ("mpich", "mpich-wheel", "mvapich"):
        netmod = (env.get("MPIR_CVAR_CH4_NETMOD") or env.get("MPICH_CH4_NETMOD") or "").lower()
        device = lib.get("device", "").lower().replace("ch4:", "").replace(",", " ").split()
        netmod = netmod or (device[0] if device else "ofi")
        if netmod.startswith("ch3") or netmod in ("tcp", "sock"):
            return "tcp", f"MPICH device {lib.get('device')}"
        if netmod == "ucx":
            return _ucx(lib, env, fabric)
        return _ofi(provider, _providers(lib.get("libfabric", "")), fabric, kind == "mpich-wheel")
    if kind in ("openmpi", "spectrum"):
        pml = env.get("OMPI_MCA_pml", "")
        if pml == "ucx" or (not pml and fabric == "infiniband"):
            return _ucx(lib, env, fabric)
        btl = set(env.get("OMPI_MCA_btl", "").split(",")) - {"self", "vader", "sm", ""}
        if pml == "ob1" or btl == {"tcp"}:
            return "tcp", "Open MPI's ob1 over its tcp btl"
        return _ofi(provider, set(), fabric, False)
    if kind == "cray-mpich":
        if "ucx" in lib.get("path", "").lower():
            return _ucx(lib, env, fabric)
        return (provider or ("cxi" if fabric == "cxi" else "verbs" if fabric == "infiniband" else "tcp"),
                "FI_PROVIDER" if provider else "Cray MPICH's libfabric")
    return _ofi(provider, set(), fabric, False)


def _ucx(lib: dict, env: Mapping[str, str], fabric: str) -> tuple[str, str]:
    tls = env.get("UCX_TLS", "")
    if tls and not any(t.strip().lstrip("^") in ("all", "rc", "ud", "dc", "rc_x", "ud_x", "dc_x", "rc_v", "ud_v",
                                                 "ib", "srd") for t in tls.split(",")):
        return "tcp", f"UCX_TLS={tls}"
    if fabric in ("infiniband", "efa"):
        ucx = lib.get("ucx", "")
        modules = Path(ucx).parent / "ucx" if ucx else None
        if not modules or not modules.is_dir() or any(modules.glob("libuct_ib*")):
            return "ucx", "UCX over the node's RDMA devices"
        return "tcp", f"UCX without InfiniBand transports ({modules})"
    return "tcp", "UCX, which has no Slingshot transport" if fabric == "cxi" else "UCX over TCP (no fast fabric)"


def _ofi(provider: str | None, plugins: set[str], fabric: str, wheel: bool) -> tuple[str, str]:
    if provider:
        return provider.split(";")[0].split(",")[0], "FI_PROVIDER"
    wanted = {"cxi": "cxi", "infiniband": "verbs", "efa": "efa"}.get(fabric)
    if wanted and (wanted in plugins or not wheel):
        return wanted, "libfabric's provider for this fabric"
    return "tcp", ("libfabric without a " + wanted + " provider (the pip wheel's has none)") if wanted else "tcp"


# -- measuring it (--ranks) ------------------------------------------------------------------------------------------
TAG = 7101  # this run's own messages: nothing else runs on the ranks meanwhile


def _pingpong(comm: Any, peer: int, first: bool, size: int, reps: int) -> float:
    """Seconds for one message's trip one way, averaged over `reps` round trips (after two to warm up)."""
    import numpy as np

    buf = np.zeros(size, dtype=np.uint8)
    for i in range(reps + 2):
        if i == 2:
            start = time.perf_counter()
        if first:
            comm.Send(buf, peer, TAG)
            comm.Recv(buf, peer, TAG)
        else:
            comm.Recv(buf, peer, TAG)
            comm.Send(buf, peer, TAG)
    return (time.perf_counter() - start) / reps / 2


def _pair(comm: Any, peer: int, first: bool, big: int, reps: int) -> dict[str, float]:
    latency = _pingpong(comm, peer, first, 8, 20 * reps)
    one_way = _pingpong(comm, peer, first, big, reps)
    return {"bandwidth_gbs": round(big / one_way / 1e9, 3), "latency_us": round(latency * 1e6, 2)}


def measure(comm: Any, big: int = 8 << 20, reps: int = 10) -> dict | None:
    """Bandwidth (messages of `big` bytes) and latency (8 bytes) between the first ranks of pairs of nodes, all pairs
    at once (so the run takes the same time on 2 nodes or 9,000), then rank 0's node with the last one where the
    count is odd; and on rank 0's node between two of its ranks, the same-node figure to compare with. Collective;
    the result on rank 0, None elsewhere. Nodes as launch.mpi.node_comm counts them (GALAPAGOS_RANKS_PER_NODE)."""
    from galapagos.launch.mpi import node_comm

    node = node_comm(comm)
    leader = node.bcast(comm.rank, root=0)
    info = comm.allgather((socket.gethostname(), leader))
    node.Free()
    leaders = sorted({lead for _, lead in info})
    names = _node_names(info, leaders)
    rounds = []
    mates = [r for r, (_, lead) in enumerate(info) if lead == 0 and r != 0]
    if mates:
        rounds.append([(0, mates[0], "same node")])
    rounds.append([(leaders[i], leaders[i + 1], "nodes") for i in range(0, len(leaders) - 1, 2)])
    if len(leaders) % 2 and len(leaders) > 1:
        rounds.append([(leaders[0], leaders[-1], "nodes")])
    mine = []
    for pairs in rounds:
        for a, b, what in pairs:
            if comm.rank in (a, b):
                figures = _pair(comm, b if comm.rank == a else a, comm.rank == a, big, reps)
                if comm.rank == a:
                    mine.append({"between": [names[info[a][1]], names[info[b][1]]], "what": what, **figures})
        comm.Barrier()
    found = comm.gather(mine, root=0)
    if comm.rank != 0:
        return None
    measured = [m for part in found for m in part]
    return {"ranks": comm.size, "nodes": len(leaders), "hosts": [names[lead] for lead in leaders],
            "message_bytes": big, "pairs": [m for m in measured if m["what"] == "nodes"],
            "same_node": next((m for m in measured if m["what"] == "same node"), None)}


def _node_names(info: list[tuple[str, int]], leaders: list[int]) -> dict[int, str]:
    """Each node by its host name; several nodes on one host (GALAPAGOS_RANKS_PER_NODE) as host#1, host#2, ..."""
    names, seen = {}, {}
    for lead in leaders:
        host = info[lead][0]
        seen[host] = seen.get(host, -1) + 1
        names[lead] = host if seen[host] == 0 else f"{host}#{seen[host]}"
    return names


def compare(result: dict, site: dict) -> tuple[dict, list[str]]:
    """What the figures are measured against (the site's fabric, else the same-node figure of the same run), and a
    warning where the slowest pair of nodes gets under half the bandwidth or over three times the latency the
    site's fabric should give."""
    mpi, warnings = site.get("mpi", {}), []
    pairs = result.get("pairs") or []
    if mpi.get("bandwidth_gbs") or mpi.get("latency_us"):
        expected = {"source": f"the site's fabric ({mpi.get('fabric', mpi.get('network', '?'))})",
                    "bandwidth_gbs": mpi.get("bandwidth_gbs"), "latency_us": mpi.get("latency_us")}
        slow = min(pairs, key=lambda p: p["bandwidth_gbs"], default=None)
        if slow and expected["bandwidth_gbs"] and slow["bandwidth_gbs"] < 0.5 * expected["bandwidth_gbs"]:
            warnings.append(f"network: {slow['bandwidth_gbs']:.2f} GB/s between {' and '.join(slow['between'])}, "
                            f"{100 * slow['bandwidth_gbs'] / expected['bandwidth_gbs']:.0f}% of the "
                            f"{expected['bandwidth_gbs']:g} GB/s {expected['source']} should give")
        late = max(pairs, key=lambda p: p["latency_us"], default=None)
        if late and expected["latency_us"] and late["latency_us"] > 3 * expected["latency_us"]:
            warnings.append(f"network: {late['latency_us']:.1f} us latency between {' and '.join(late['between'])} "
                            f"against the {expected['latency_us']:g} us {expected['source']} should give")
    elif result.get("same_node"):
        expected = {"source": "the same node, this run", **{k: result["same_node"][k]
                                                            for k in ("bandwidth_gbs", "latency_us")}}
    else:
        expected = {"source": "nothing (one rank per node, no profile)"}
    return expected, warnings


def format_ranks(result: dict) -> list[str]:
    lines = [(f"network run: {result['ranks']} rank(s) on {result['nodes']} node(s), messages of "
              f"{result['message_bytes'] >> 20} MiB and 8 bytes")]
    for p in result.get("pairs", []):
        lines.append(f"  {p['between'][0]} <-> {p['between'][1]}: {p['bandwidth_gbs']:.2f} GB/s, "
                     f"{p['latency_us']:.1f} us")
    if not result.get("pairs"):
        lines.append("  one node: nothing between nodes to measure (GALAPAGOS_RANKS_PER_NODE=K counts K ranks as a "
                     "node)")
    exp = result.get("expected", {})
    if "bandwidth_gbs" in exp or "latency_us" in exp:
        lines.append(f"  against {exp['source']}: {exp.get('bandwidth_gbs') or '?'} GB/s, "
                     f"{exp.get('latency_us') or '?'} us")
    return lines


def run_ranks(n: int, timeout: float = 300, env: Mapping[str, str] | None = None) -> dict:
    """`measure` on n ranks started with mpiexec (the one beside this Python, as evolve starts its ranks).
    Raises RuntimeError with one line when the run fails."""
    from galapagos.launch.mpi import mpiexec

    with tempfile.TemporaryDirectory(prefix="galapagos-netcheck-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "galapagos.launch.netcheck", str(out)]
        proc = subprocess.Popen(cmd, env=dict(os.environ if env is None else env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"--ranks {n}: the run across the nodes did not end in {timeout:g} s") from None
        if proc.returncode != 0 or not out.exists():
            last = (output or "").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"--ranks {n}: the run across the nodes failed (exit code {proc.returncode}): "
                               f"{last[0]}")
        return json.loads(out.read_text())


def main(argv: list[str]) -> int:
    from galapagos.launch.mpi import world

    result = measure(world())
    if result is not None:
        Path(argv[0]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
