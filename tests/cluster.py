"""A cluster of several nodes on this one machine, made of Linux namespaces, for the multi-node tests.

Every claim about several nodes (one copy of the data per node, staging to node-local storage, host lists, ranks
placed across hosts) is tested here on nodes that are nodes as far as the software can tell:

- each node is a long-lived holder process (`unshare --net --uts --mount ... sleep`) with its own network namespace,
  hostname, and mount namespace in which a fresh tmpfs is mounted on /dev/shm, another on `LOCAL` (the node-local
  directory: one path that every node sees as its own, empty on the host) and the cluster's hosts file on
  /etc/hosts. Everything else (/tmp, /work, the venv, /sys with its cgroup mounts, the PID space) is the host's.
- the nodes' `eth0` are veth pairs to a bridge in a "switch" namespace of its own, so the root namespace gets no
  link, address or route; addresses are 10.213.S.(i+1)/24, where S is claimed per cluster (two clusters at once get
  different subnets). The root namespace cannot reach the nodes: talk to them from inside one (`run`, `popen`).
- a command enters a node with `nsenter -t HOLDER -u -m -n --wd=CWD` (the node's hostname, mounts and network;
  `--wd` because joining a mount namespace moves the working directory to its root, man nsenter(1)).
- `mpiexec` runs the mpich wheel's Hydra on node 0 with its ssh launcher pointed at `launcher`, a small script that
  takes Hydra's ssh arguments and enters the named node instead. Hydra runs the local node's proxy by fork and
  calls the launcher for every other host as ``LAUNCHER -x HOST "/path/hydra_pmi_proxy" --control-port node0:PORT
  ... --proxy-id K`` (logged from a real run: only ``-x`` before the host; the command is one shell string, as ssh
  gets it). https://github.com/pmodels/mpich/blob/main/doc/wiki/how_to/Using_the_Hydra_Process_Manager.md
- MPICH between the nodes: the wheel's default netmod is UCX, which finds the other "nodes" on the same kernel and
  moves their messages through shared memory / cross-memory attach, never the veths. `MPI_ENV` restricts UCX to
  TCP on eth0 (UCX_TLS, UCX_NET_DEVICES: https://openucx.readthedocs.io/en/master/faq.html); ranks on one node
  still meet through MPICH's own shared memory (in that node's /dev/shm). MPIR_CVAR_CH4_NETMOD=ofi with
  FI_PROVIDER=tcp works as well.

Teardown (`close`, also at interpreter exit, and the holders get SIGKILL if the process that made them dies) kills
every process inside the cluster's namespaces and the holders: the namespaces, veths and bridge go with them.

    with Cluster(4) as c:
        c.run(1, ["hostname"])                       # in node1
        c.mpiexec(["python", "x.py"], ppn=[2, 1, 1, 1])  # 5 ranks across the 4 nodes
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

LOCAL = "/tmp/galapagos-node-local"  # each node's own local directory (a tmpfs), the same path on every node
CLAIMS = Path(tempfile.gettempdir()) / "galapagos-clusters"  # subnets in use: S -> the pid of the owner
PREFIX = "10.213"
MPI_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0"}  # MPICH's messages between nodes over the veths
VENV_BIN = Path(sys.executable).parent

# Run by every holder: its mounts, hostname and loopback; then it waits for its veth, configures it and holds the
# namespaces once the link has its carrier (UCX skips a device without one). $1 name, $2 address/24, $3 hosts file.
_HOLDER = """set -e
mount -t tmpfs -o mode=1777 shm /dev/shm
mount -t tmpfs -o mode=1777 local "{local}"
mount --bind "$3" /etc/hosts
hostname "$1"
ip link set lo up
echo made
read go
ip addr add "$2" dev eth0
ip link set eth0 up
until ip link show eth0 | grep -q LOWER_UP; do sleep 0.02; done
echo ready
exec sleep infinity
"""


class ClusterError(RuntimeError):
    """The cluster could not be made or used; the message names the node and the step."""


@functools.lru_cache(maxsize=1)
def cluster_problem() -> str | None:
    """Why namespace nodes cannot be made here (the reason tests skip with), or None."""
    if not sys.platform.startswith("linux"):
        return f"namespace clusters need Linux, not {sys.platform}"
    if os.geteuid() != 0:
        return "namespace clusters need root (network and mount namespaces, veths, tmpfs mounts)"
    missing = [t for t in ("ip", "unshare", "nsenter") if not shutil.which(t)]
    if missing:
        return f"namespace clusters need {', '.join(missing)} (iproute2, util-linux)"
    if not (VENV_BIN / "mpiexec").exists():
        return f"no Hydra mpiexec beside {sys.executable} (pip install mpich)"
    trial = "mount -t tmpfs t /dev/shm && ip link add name va type veth peer name vb && ip link set lo up"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "sh", "-c", trial], check=False,
                           capture_output=True, text=True)
    if probe.returncode:
        return f"cannot make namespaces here: {probe.stderr.strip() or 'unshare failed'}"
    return None


@dataclass(frozen=True)
class Node:
    """One node: its name (hostname), address on the cluster's bridge and holder process."""

    index: int
    name: str
    address: str
    pid: int

    @property
    def root(self) -> Path:
        """The node's file system seen from outside (its /dev/shm and LOCAL are its own)."""
        return Path(f"/proc/{self.pid}/root")

    @property
    def local(self) -> Path:
        """The node's local directory seen from outside (inside the node it is LOCAL)."""
        return self.root / LOCAL.lstrip("/")

    def enter(self, cwd: str | os.PathLike | None = None) -> list[str]:
        """The argv prefix that runs a command inside this node (hostname, mounts, network)."""
        return ["nsenter", "-t", str(self.pid), "-u", "-m", "-n", f"--wd={os.fspath(cwd or os.getcwd())}", "--"]

    def namespaces(self) -> set[int]:
        """The inodes of the node's network and mount namespaces."""
        return {os.stat(f"/proc/{self.pid}/ns/{kind}").st_ino for kind in ("net", "mnt")}


def _die_with_parent() -> None:
    """In a holder: SIGKILL when the process that made it dies (prctl PR_SET_PDEATHSIG), so none outlives it."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def _claim_subnet() -> int:
    """A third octet no live cluster on this machine uses."""
    CLAIMS.mkdir(parents=True, exist_ok=True)
    for s in range(1, 255):
        path = CLAIMS / str(s)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(path.read_text() or 0)
                os.kill(owner, 0)
                continue
            except (ValueError, ProcessLookupError):
                path.unlink(missing_ok=True)  # its owner is gone: take it over
                return _claim_subnet()
            except OSError:
                continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return s
    raise ClusterError(f"every subnet {PREFIX}.1-254.0/24 is claimed in {CLAIMS}")


class Cluster:
    """n namespace nodes on one bridge; a context manager. Nodes are named `{name}0`..`{name}{n-1}`."""

    def __init__(self, n: int, name: str = "node") -> None:
        if n < 1:
            raise ClusterError(f"Cluster({n}): a cluster needs at least one node")
        self.n, self.prefix = n, name
        self.nodes: list[Node] = []
        self.subnet: int | None = None
        self.dir: Path | None = None
        self._procs: list[subprocess.Popen] = []

    # -- life ------------------------------------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Cluster:
        """Make the switch and the nodes (about 0.1 s a node); on any failure, undo everything and raise."""
        if (why := cluster_problem()) is not None:
            raise ClusterError(why)
        atexit.register(self.close)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.subnet = _claim_subnet()
        self.dir = Path(tempfile.mkdtemp(prefix=f"galapagos-cluster-{self.subnet}-"))
        os.makedirs(LOCAL, exist_ok=True)
        names = [f"{self.prefix}{i}" for i in range(self.n)]
        addresses = [f"{PREFIX}.{self.subnet}.{i + 1}" for i in range(self.n)]
        hosts = self.dir / "hosts"
        hosts.write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                         + "".join(f"{a} {n}\n" for a, n in zip(addresses, names)))
        switch = self._spawn(["unshare", "--net", "sh", "-c", "echo made; exec sleep infinity"], stdin=None)
        holders = [self._spawn(["unshare", "--net", "--uts", "--mount", "--propagation", "private", "sh", "-c",
                                _HOLDER.format(local=LOCAL), "holder", name, f"{a}/24", str(hosts)])
                   for name, a in zip(names, addresses)]
        for name, proc in [("switch", switch), *zip(names, holders)]:
            self._expect(proc, "made", name)
        links = [f"link add v{i} type veth peer name eth0 netns {p.pid}" for i, p in enumerate(holders)]
        links += ["link add br0 type bridge", "link set br0 up"]
        links += [f"link set v{i} master br0 up" for i in range(self.n)]
        proc = subprocess.run(["nsenter", "-t", str(switch.pid), "-n", "ip", "-batch", "-"],
                              input="\n".join(links) + "\n", capture_output=True, text=True, check=False)
        if proc.returncode:
            raise ClusterError(f"cluster {self.subnet}: cannot wire the switch: {proc.stderr.strip()}")
        for holder in holders:
            holder.stdin.write("go\n")
            holder.stdin.flush()
        for name, holder in zip(names, holders):
            self._expect(holder, "ready", name)
        self.nodes = [Node(i, n, a, p.pid) for i, (n, a, p) in enumerate(zip(names, addresses, holders))]
        self._write_launcher()

    def _spawn(self, argv: list[str], stdin: Any = subprocess.PIPE) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_die_with_parent)
        self._procs.append(proc)
        return proc

    def _expect(self, proc: subprocess.Popen, word: str, name: str) -> None:
        line = proc.stdout.readline().strip()
        if line != word:
            proc.kill()
            raise ClusterError(f"cluster {self.subnet}: {name} failed before '{word}': {proc.stderr.read().strip()}")

    def _write_launcher(self) -> None:
        """The program Hydra's ssh launcher runs: `LAUNCHER [-x ...] HOST COMMAND` -> COMMAND inside node HOST."""
        cases = "".join(f"  {n.name}|{n.address}) pid={n.pid} ;;\n" for n in self.nodes)
        self.launcher.write_text(
            "#!/bin/sh\n# Hydra's ssh launcher for namespace cluster nodes (tests/cluster.py)\n"
            'while [ "${1#-}" != "$1" ]; do shift; done\nhost=$1; shift\ncase $host in\n' + cases +
            f'  *) echo "cluster launcher: no node named $host in {" ".join(self.hosts)}" >&2; exit 255 ;;\n'
            'esac\nexec nsenter -t "$pid" -u -m -n --wd="$PWD" -- sh -c "$*"\n')
        self.launcher.chmod(0o755)

    def close(self) -> None:
        """Kill every process in the cluster's namespaces and the holders; the namespaces and links go with them."""
        spaces = set()  # of every holder, and the switch: also those of a start that failed half-way
        for proc in self._procs:
            for kind in ("net", "mnt"):
                try:
                    spaces.add(os.stat(f"/proc/{proc.pid}/ns/{kind}").st_ino)
                except OSError:
                    pass
        spaces -= {os.stat(f"/proc/self/ns/{kind}").st_ino for kind in ("net", "mnt")}  # the switch's mounts are ours
        for _ in range(20):  # a killed process's children may have forked meanwhile: until none is left
            inside = [pid for pid in pids_in(spaces) if pid != os.getpid()]
            if not inside:
                break
            for pid in inside:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        for proc in self._procs:
            proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
        self._procs, self.nodes = [], []
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self.subnet is not None:
            (CLAIMS / str(self.subnet)).unlink(missing_ok=True)
            self.subnet = None
        atexit.unregister(self.close)

    # -- what a test asks --------------------------------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    @property
    def launcher(self) -> Path:
        """The program for Hydra's `-launcher ssh -launcher-exec` (or `-launcher rsh`)."""
        assert self.dir is not None, "the cluster is not started"
        return self.dir / "launcher"

    def node(self, which: int | str | Node) -> Node:
        if isinstance(which, Node):
            return which
        for n in self.nodes:
            if which in (n.index, n.name, n.address):
                return n
        raise ClusterError(f"no node {which!r} in cluster {self.hosts}")

    def command(self, node: int | str | Node, argv: Sequence[str | os.PathLike],
                cwd: str | os.PathLike | None = None) -> list[str]:
        """argv that runs `argv` inside `node`, in `cwd` (default: this process's)."""
        return [*self.node(node).enter(cwd), *map(os.fspath, argv)]

    def run(self, node: int | str | Node, argv: Sequence[str | os.PathLike], **kwargs: Any
            ) -> subprocess.CompletedProcess:
        """subprocess.run inside `node` (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", not {"stdout", "stderr"} & kwargs.keys())
        kwargs.setdefault("text", True)
        kwargs.setdefault("check", False)
        return subprocess.run(self.command(node, argv, kwargs.pop("cwd", None)), **kwargs)

    def popen(self, node: int | str | Node, argv: Sequence[str | os.PathLike], **kwargs: Any) -> subprocess.Popen:
        """subprocess.Popen inside `node`."""
        return subprocess.Popen(self.command(node, argv, kwargs.pop("cwd", None)), **kwargs)

    def kill_node(self, node: int | str | Node) -> int:
        """The node dies: SIGKILL its holder first, so that the launcher's entry for it fails from then on, then every
        process in its namespaces. Returns how many processes were killed."""
        dead = self.node(node)
        spaces, killed = dead.namespaces(), 1
        os.kill(dead.pid, signal.SIGKILL)
        for _ in range(20):  # a killed process's children may have forked meanwhile: until none is left
            inside = [pid for pid in pids_in(spaces) if pid not in (os.getpid(), dead.pid)]
            if not inside:
                break
            for pid in inside:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return killed

    def shm(self, node: int | str | Node) -> list[str]:
        """The names in the node's own /dev/shm."""
        return sorted(os.listdir(self.node(node).root / "dev/shm"))

    def shm_used(self, node: int | str | Node) -> int:
        """Bytes in use in the node's /dev/shm (files whose name is gone still count while they are mapped)."""
        st = os.statvfs(self.node(node).root / "dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def net_bytes(self, node: int | str | Node) -> tuple[int, int]:
        """(received, sent) bytes of the node's eth0: data between nodes crosses it, on-node traffic does not."""
        for line in Path(f"/proc/{self.node(node).pid}/net/dev").read_text().splitlines():
            name, _, fields = line.partition(":")
            if name.strip() == "eth0":
                values = fields.split()
                return int(values[0]), int(values[8])
        raise ClusterError(f"node {self.node(node).name} has no eth0")

    # -- MPI across the nodes ----------------------------------------------------------------------------------------
    def mpiexec_argv(self, argv: Sequence[str | os.PathLike], ppn: int | Sequence[int] = 1,
                     hosts: Sequence[str] | None = None, n: int | None = None) -> list[str]:
        """Hydra's command for `argv` on `hosts` (default: every node), `ppn` ranks on each (or one count per host),
        ranks filled host by host in order; to be run inside node 0 (`mpiexec` does)."""
        hosts = list(self.hosts if hosts is None else hosts)
        counts = [ppn] * len(hosts) if isinstance(ppn, int) else list(ppn)
        if len(counts) != len(hosts) or min(counts, default=0) < 1:
            raise ClusterError(f"mpiexec: {len(counts)} rank count(s) {counts} for {len(hosts)} host(s) {hosts}")
        for h in hosts:
            self.node(h)
        total = sum(counts) if n is None else n
        return [str(VENV_BIN / "mpiexec"), "-launcher", "ssh", "-launcher-exec", str(self.launcher),
                "-hosts", ",".join(f"{h}:{c}" for h, c in zip(hosts, counts)), "-n", str(total), *map(os.fspath, argv)]

    def mpi_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment (or `env`) with what MPICH needs between the nodes (MPI_ENV)."""
        return {**(os.environ if env is None else env), **MPI_ENV}

    def mpiexec(self, argv: Sequence[str | os.PathLike], ppn: int | Sequence[int] = 1,
                hosts: Sequence[str] | None = None, n: int | None = None, env: dict[str, str] | None = None,
                timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run `argv` as an MPI job across the nodes, from node 0; a job past `timeout` is killed (process group)
        and returned with returncode -9 and the output so far."""
        cmd = self.command(0, self.mpiexec_argv(argv, ppn, hosts, n), kwargs.pop("cwd", None))
        proc = subprocess.Popen(cmd, env=self.mpi_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n[cluster: killed after {timeout:g} s]"
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def pids_in(spaces: set[int]) -> list[int]:
    """Processes whose network or mount namespace is one of `spaces`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        for kind in ("net", "mnt"):
            try:
                if os.stat(f"/proc/{entry}/ns/{kind}").st_ino in spaces:
                    found.append(int(entry))
                    break
            except OSError:
                break
    return found
