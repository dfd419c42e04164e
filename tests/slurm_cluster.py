"""A Slurm cluster of several nodes on this one machine, for the tests: one slurmctld and one slurmd per node of the
namespace cluster (tests/cluster.py), so that `sbatch --nodes 4`, `srun` and `sbcast` run real multi-node jobs.

How it stays out of everything else's way:
- its own slurm.conf (clients find it through SLURM_CONF) in a directory of its own, with its own ports, state,
  spool, pid and log files: the one-node cluster of .ci/slurm-up (/etc/slurm/slurm.conf) can run beside it;
- its own munged on a socket in that directory, with a key of its own (slurm.conf AuthInfo=socket=...,
  https://slurm.schedmd.com/slurm.conf.html#OPT_AuthInfo): a unix socket named by a path is reached from every
  network namespace, and nothing depends on the system's munged;
- slurmctld runs in node 0's namespaces, the way a cluster's controller sits on a machine of the cluster network,
  and every client (sbatch, squeue, scontrol, `galapagos launch --submit`) runs there too, as on a login node: the
  nodes' addresses need no route from the machine's own namespace;
- each slurmd runs in its node's namespaces: its hostname names its node (NodeName, NodeHostname) and NodeAddr is
  the node's address on the bridge, so srun, sbcast and the MPI ranks talk between nodes over the network.

slurmd 22.05 will not start without the cgroup file systems under /sys/fs/cgroup, even with proctrack/linuxproc
and task/affinity ("Unable to initialize cgroup plugin"): the nodes keep the machine's /sys for that (a fresh sysfs,
as `ip netns exec` mounts, has none).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster import Cluster, Node

COMMANDS = ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "srun", "sbcast", "scontrol", "sinfo",
            "squeue", "scancel", "nsenter")
CTLD_PORT, SLURMD_PORT = 6917, 6918  # not 6817/6818, those of .ci/slurm-up's cluster
# The states a job ends in (squeue(1), JOB STATE CODES, https://slurm.schedmd.com/squeue.html): every other state,
# SIGNALING, STAGE_OUT, REQUEUED and RESIZING included, is one the job passes through
ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "TIMEOUT")


def job_fields(scontrol_output: str) -> dict[str, str]:
    """The fields of `scontrol show job --oneliner`."""
    return dict(re.findall(r"(\w+)=(\S*)", scontrol_output))


def until_ended(lookup: Callable[[], dict[str, str]], timeout: float, poll: float) -> dict[str, str] | None:
    """A job's fields (as `lookup` reads them) once it is in a state it ends in; None when `timeout` s pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (info := lookup()).get("JobState") in ENDED:
            return info
        time.sleep(poll)
    return None


def slurm_problem() -> str | None:
    """Why a multi-node Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "not root: slurmd, slurmctld and munged must run as root to start jobs for the tests"
    missing = [c for c in COMMANDS if not shutil.which(c)]
    if missing:
        return f"{', '.join(missing)} not found: install slurm-wlm and munge (.ci/slurm-up --install)"
    return None


@dataclass
class SlurmCluster:
    root: Path  # slurm.conf, munge key and socket, state, spool, logs
    machines: Cluster  # the namespace nodes it runs on
    conf: Path = field(init=False)
    env: dict[str, str] = field(init=False)  # for the clients: this cluster's SLURM_CONF

    def __post_init__(self):
        self.conf = self.root / "slurm.conf"
        # none of a surrounding job's variables (the tests may run inside a Slurm job): only this cluster's conf
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))},
                    "SLURM_CONF": str(self.conf)}

    @property
    def nodes(self) -> list[Node]:
        return self.machines.nodes

    @property
    def names(self) -> list[str]:
        return self.machines.hosts

    def on_login(self, argv: Sequence[str | os.PathLike], cwd: str | os.PathLike | None = None) -> list[str]:
        """argv run as on a login node: in node 0's namespaces, where slurmctld is."""
        return self.machines.command(0, argv, cwd)

    def client(self, *argv, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.on_login(argv), env=self.env, capture_output=True, text=True, check=False,
                              timeout=timeout)

    def node_states(self) -> dict[str, str]:
        proc = self.client("sinfo", "--noheader", "--Node", "-o", "%N %T", timeout=30)
        return dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)

    def job(self, job_id: str) -> dict[str, str]:
        return job_fields(self.client("scontrol", "show", "job", "--oneliner", job_id, timeout=30).stdout)

    def wait(self, job_id: str, timeout: float) -> dict[str, str]:
        """The job's fields once it has ended; it is cancelled and TimeoutError raised when it runs past timeout."""
        if info := until_ended(lambda: self.job(job_id), timeout, poll=1):
            return info
        self.client("scancel", job_id)
        raise TimeoutError(f"Slurm job {job_id} did not end within {timeout:.0f} s: {self.job(job_id)}\n"
                           f"{self.logs()}")

    def logs(self, lines: int = 15) -> str:
        """The last lines of every daemon's log, for failure messages."""
        out = []
        for log in sorted((self.root / "log").glob("*.log")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel what still runs, then stop every daemon this cluster started, by its pid file."""
        if self.conf.exists():
            self.client("scancel", "--user", "root", timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.client("squeue", "--noheader", timeout=30).stdout.strip():
                time.sleep(1)
        run = self.root / "run"
        _end([*run.glob("slurmd-*.pid"), run / "slurmctld.pid"])
        _end([run / "munged.pid"])  # last: the others authenticate through it until they stop


def _end(pid_files: Sequence[Path], wait: float = 15) -> None:
    """SIGTERM to the daemons of these pid files, then SIGKILL to those still there after `wait` seconds."""
    pids = []
    for pid_file in pid_files:
        try:
            pids.append(int(pid_file.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for pid in pids if _signal(pid, sig)]
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [pid for pid in pids if _signal(pid, 0)]


def _signal(pid: int, sig: int) -> bool:
    """Send sig; False when the process is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def start_slurm(machines: Cluster, root: Path, timeout: float = 60) -> SlurmCluster:
    """munged, slurmctld (in node 0) and one slurmd per node; returns once every node is idle. RuntimeError (with
    the daemons' logs) when the cluster does not come up; the daemons already started are stopped again."""
    cluster = SlurmCluster(Path(root), machines)
    if len(str(cluster.root)) > 64:  # munge's socket and slurmd's step sockets live under it (108 bytes at most)
        raise RuntimeError(f"{cluster.root}: too long a path for the cluster's unix sockets (64 characters at most)")
    for sub in ("log", "run", "state", "spool", "munge"):
        (cluster.root / sub).mkdir(parents=True, exist_ok=True)
    try:
        _start_munge(cluster.root / "munge", cluster.root / "run")
        _write_conf(cluster)
        for node in cluster.nodes:
            (cluster.root / "spool" / node.name).mkdir(exist_ok=True)
        _daemon(cluster, cluster.nodes[0], "slurmctld")
        for node in cluster.nodes:
            _daemon(cluster, node, "slurmd")
        _wait_idle(cluster, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_munge(where: Path, run: Path) -> None:
    where.chmod(0o755)  # munged wants its socket's directory searchable by all
    key = where / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket = where / "socket"
    # --force overrides munged's refusals for "insecure file/directory permissions" and a leftover socket
    # (munged(8)): the key lives in a temporary directory, under a world-writable /tmp
    proc = subprocess.run(["munged", "--force", f"--socket={socket}", f"--key-file={key}",
                           f"--log-file={where / 'munged.log'}", f"--pid-file={run / 'munged.pid'}",
                           f"--seed-file={where / 'munged.seed'}"],
                          capture_output=True, text=True, check=False, timeout=30)
    quoted = shlex.quote(str(socket))
    check = subprocess.run(f"munge -n -S {quoted} | unmunge -S {quoted}", shell=True, capture_output=True,
                           text=True, check=False, timeout=30)
    if proc.returncode != 0 or check.returncode != 0:
        raise RuntimeError(f"munged did not start: {(proc.stderr + check.stderr).strip()}")


def _hardware() -> str:
    """This machine's CPUs as slurmd describes them (`slurmd -C`), which every node reports alike."""
    line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True, timeout=30).stdout
    words = line.splitlines()[0].split()
    return " ".join(w for w in words if w.split("=")[0] in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket",
                                                              "ThreadsPerCore"))


def _write_conf(cluster: SlurmCluster) -> None:
    root, head, hw = cluster.root, cluster.nodes[0], _hardware()
    nodes = [f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.address} {hw} State=UNKNOWN"
             for n in cluster.nodes]
    # %n in the slurmd paths: each node's own spool, pid and log (https://slurm.schedmd.com/slurm.conf.html)
    cluster.conf.write_text(f"""\
# Written by tests/slurm_cluster.py: {len(nodes)} namespace nodes on one machine.
ClusterName=galapagos-ns
SlurmctldHost={head.name}({head.address})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root / 'munge' / 'socket'}
CredType=cred/munge
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}/%n
SlurmctldPidFile={root / 'run'}/slurmctld.pid
SlurmdPidFile={root / 'run'}/slurmd-%n.pid
SlurmctldLogFile={root / 'log'}/slurmctld.log
SlurmdLogFile={root / 'log'}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
{chr(10).join(nodes)}
PartitionName=nodes Nodes={','.join(cluster.names)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")


def _daemon(cluster: SlurmCluster, node: Node, name: str) -> None:
    """slurmctld or slurmd in the node's namespaces; it forks into the background once it has started."""
    proc = subprocess.run(cluster.machines.command(node, [name, "-f", cluster.conf], cwd="/"), env=cluster.env,
                          capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} did not start on {node.name}: {proc.stderr.strip()}\n{cluster.logs()}")


def _wait_idle(cluster: SlurmCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = cluster.node_states()
        if sorted(states) == sorted(cluster.names) and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the Slurm nodes did not become idle within {timeout:.0f} s: "
                       f"{json.dumps(states) if states else 'sinfo gave no answer'}\n{cluster.logs()}")
