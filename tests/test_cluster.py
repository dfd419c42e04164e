"""Several nodes for real: a 4-node cluster of Linux namespaces (tests/cluster.py), its ranks started by Hydra's
mpiexec across the nodes as a site starts them, MPICH's messages over the veths between the nodes.

What is claimed about several nodes is checked here: the ranks land on the hosts the host list names; an evolution
and an ensemble run across the nodes to the right results; the data is read once and held as exactly one copy per
node, each in that node's own /dev/shm (none on the host), after crossing the network to every other node; staging
fills each node's own local directory. Skipped with the reason where namespaces cannot be made (not root, no
iproute2); CI runs as root.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from cluster import LOCAL, Cluster, ClusterError, cluster_problem, pids_in
from mpirun import describe_run

from galapagos.examples import shapes

pytestmark = pytest.mark.mpi
SCRIPTS = Path(__file__).parent / "mpi_scripts"
TINY = ["--set", "train.epochs=1", "--set", "space.max_layers=3", "--set", "space.channels=[4, 8]",
        "--set", "space.units=[16, 32]", "--set", "evolution.population_size=4"]
PLACEMENT = [2, 1, 1, 1]  # rank 0 (the master) and one worker on node0, one worker on each other node


@pytest.fixture(scope="module")
def cluster():
    if (why := cluster_problem()) is not None:
        pytest.skip(why)
    with Cluster(4) as c:
        yield c


def hosts_of_ranks(cluster: Cluster, ppn: list[int]) -> list[str]:
    """The host of each rank, as Hydra fills `-hosts h0:c0,h1:c1,...`: host by host, in order."""
    return [h for h, count in zip(cluster.hosts, ppn) for _ in range(count)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ppn", [PLACEMENT, [1, 2, 2, 1]], ids=["master-beside-workers", "master-alone"])
def test_ranks_land_on_the_nodes_the_host_list_names(cluster, ppn):
    proc = cluster.mpiexec([sys.executable, "-m", "mpi4py", SCRIPTS / "cluster_ranks.py"], ppn=ppn, timeout=50)
    assert proc.returncode == 0, describe_run(proc)
    placed = {r["rank"]: (r["host"], r["processor"], r["node"]) for line in proc.stdout.splitlines()
              if line.startswith("PLACED ") for r in json.loads(line[7:])}
    expected = hosts_of_ranks(cluster, ppn)
    assert sorted(placed) == list(range(len(expected))), describe_run(proc)
    for rank, (host, processor, group) in placed.items():
        assert host == processor == expected[rank], (rank, placed)
        assert group == [r for r, h in enumerate(expected) if h == host], (rank, placed)  # node_comm: by host


@pytest.fixture(scope="module")
def shared(cluster, tmp_path_factory):
    """datashare across the cluster (2 ranks a node), observed from outside while every rank holds the data."""
    tmp = tmp_path_factory.mktemp("share")
    rng = np.random.default_rng(7)
    path = tmp / "d.h5"
    with h5py.File(path, "w") as f:  # written in blocks: 48 MiB of float32 images, and labels
        f.attrs.update(task="classification", num_classes=5)
        x = f.create_dataset("train/x", (768, 4, 64, 64), "float32")
        for a in range(0, 768, 128):
            x[a:a + 128] = rng.standard_normal((128, 4, 64, 64), dtype=np.float32)
        f["train/y"] = rng.integers(0, 5, 768)
    with h5py.File(path) as f:
        digests = {f"train/{k}": hashlib.blake2b(f["train"][k][()].tobytes(), digest_size=16).hexdigest()
                   for k in ("x", "y")}
        nbytes = f["train/x"].nbytes + f["train/y"].nbytes
    hold = tmp / "hold"
    hold.mkdir()
    before = {h: (cluster.shm_used(h), cluster.net_bytes(h)[0]) for h in cluster.hosts}
    cmd = cluster.command(0, cluster.mpiexec_argv([sys.executable, "-m", "mpi4py", SCRIPTS / "cluster_share.py", path,
                                                   hold], ppn=2))
    proc = subprocess.Popen(cmd, env=cluster.mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 90
    while not (hold / "holding").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    during = {h: (cluster.shm_used(h), cluster.shm(h)) for h in cluster.hosts}
    host_shm = set(os.listdir("/dev/shm"))
    (hold / "release").write_text("1")
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
    run = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    after = {h: cluster.net_bytes(h)[0] for h in cluster.hosts}
    reports = {r["rank"]: r for line in out.splitlines() if line.startswith("SHARED ") for r in json.loads(line[7:])}
    return {"run": run, "reports": reports, "nbytes": nbytes, "digests": digests, "before": before,
            "during": during, "after": after, "host_shm": host_shm}


@pytest.mark.timeout(150)
def test_exactly_one_copy_of_the_data_per_node_each_in_its_own_shm(cluster, shared):
    run, reports, nbytes = shared["run"], shared["reports"], shared["nbytes"]
    assert run.returncode == 0 and sorted(reports) == list(range(8)), describe_run(run)
    assert all(r["digests"] == shared["digests"] for r in reports.values()), "a rank read other bytes than the file"
    by_host: dict[str, list[dict]] = {}
    for _, r in sorted(reports.items()):
        by_host.setdefault(r["host"], []).append(r)
    assert sorted(by_host) == cluster.hosts and all(len(rs) == 2 for rs in by_host.values()), by_host
    host_shm_dev = os.stat("/dev/shm").st_dev
    for host, rs in by_host.items():
        assert len({(r["dev"], r["ino"]) for r in rs}) == 1, f"{host}: its ranks map different segments: {rs}"
        assert rs[0]["dev"] == rs[0]["shm_dev"] != host_shm_dev, f"{host}: the copy is not in the node's /dev/shm"
        grown = shared["during"][host][0] - shared["before"][host][0]
        assert nbytes <= grown < 2 * nbytes, f"{host}: its /dev/shm grew by {grown} bytes for {nbytes} of data"
    assert len({rs[0]["dev"] for rs in by_host.values()}) == 4  # four tmpfs, one per node
    assert not {r["name"] for r in reports.values()} & shared["host_shm"]  # nothing in the host's /dev/shm


@pytest.mark.timeout(150)
def test_the_data_crossed_the_network_to_every_other_node(cluster, shared):
    assert shared["run"].returncode == 0, describe_run(shared["run"])
    for host in cluster.hosts[1:]:  # node0's rank 0 read the file; every other node received it over its veth
        received = shared["after"][host] - shared["before"][host][1]
        assert received >= shared["nbytes"], f"{host} received {received} bytes over eth0, the data is " \
                                             f"{shared['nbytes']}"


def journal(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]


@pytest.mark.timeout(240)
def test_evolve_then_ensemble_across_four_nodes(cluster, tmp_path):
    data = tmp_path / "shapes.h5"
    shapes.generate(data, samples=300, size=12, seed=1)
    cli = [sys.executable, "-m", "galapagos.cli"]
    run, ens = tmp_path / "run", tmp_path / "ens"
    proc = cluster.mpiexec([*cli, "evolve", "--data", data, "--out", run, "--evaluations", "8", *TINY],
                           ppn=PLACEMENT, timeout=110)
    assert proc.returncode == 0, describe_run(proc)
    expected = hosts_of_ranks(cluster, PLACEMENT)
    records = journal(run)
    assert len(records) == 8 and all(r["status"] == "ok" for r in records), records
    assert all(r["host"] == expected[r["rank"]] for r in records), [(r["rank"], r["host"]) for r in records]
    assert {r["host"] for r in records} == set(cluster.hosts)  # every node's worker trained (4 at once to start)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["evaluations"] == 8 and summary["workers"] == 4, summary
    assert (run / "best" / "model.pt").exists() and (run / "best" / "genome.json").exists()

    proc = cluster.mpiexec([*cli, "ensemble", "--from", run, "--data", data, "--out", ens, "--members", "4"],
                           ppn=PLACEMENT, timeout=110)
    assert proc.returncode == 0, describe_run(proc)
    members = journal(ens)
    assert len(members) == 4 and all(r["status"] == "ok" for r in members), members
    assert all(r["host"] == expected[r["rank"]] for r in members), [(r["rank"], r["host"]) for r in members]
    metrics = json.loads((ens / "metrics.json").read_text())
    assert metrics["status"] == {"ok": 4}
    assert {"accuracy", "nll", "ece"} <= metrics["test"]["ensemble"].keys() and \
        metrics["test"]["ensemble"]["samples"] == 45, metrics["test"]


@pytest.mark.timeout(300)
def test_each_candidate_and_ensemble_member_trains_over_two_nodes_in_a_gang(cluster, tmp_path):
    """run.spread_ranks = 2 (launch/gang.py): workers 1 and 2 (node0, node1) and 3 and 4 (node2, node3) make two
    gangs, each of whose candidates trains on both of its nodes, the group meeting over the network; the followers
    take no task of their own, and the run counts two candidates at once."""
    data = tmp_path / "shapes.h5"
    shapes.generate(data, samples=300, size=12, seed=1)
    cli = [sys.executable, "-m", "galapagos.cli"]
    run, ens = tmp_path / "run", tmp_path / "ens"
    gang = ["--set", "run.spread_ranks=2"]
    proc = cluster.mpiexec([*cli, "evolve", "--data", data, "--out", run, "--evaluations", "4", *TINY, *gang],
                           ppn=PLACEMENT, timeout=130)
    assert proc.returncode == 0, describe_run(proc)
    expected = hosts_of_ranks(cluster, PLACEMENT)
    records = journal(run)
    assert len(records) == 4 and all(r["status"] == "ok" and r["metrics"]["spread"] == 2 for r in records), records
    assert {r["rank"] for r in records} <= {1, 3} and all(r["host"] == expected[r["rank"]] for r in records)
    for follower in (2, 4):  # each follower's trainer child trained its part, on its own node
        assert (run / "log" / f"trainer-{follower}.log").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 4 and summary["slots"] == 2, summary

    proc = cluster.mpiexec([*cli, "ensemble", "--from", run, "--data", data, "--out", ens, "--members", "2", *gang],
                           ppn=PLACEMENT, timeout=130)
    assert proc.returncode == 0, describe_run(proc)
    members = journal(ens)
    assert len(members) == 2 and all(r["status"] == "ok" and r["metrics"]["spread"] == 2 for r in members), members


@pytest.mark.timeout(60)
def test_staging_fills_each_nodes_own_local_directory(cluster, tmp_path):
    """PBS's staging lines (one copy per node through the launcher, `mpiexec -n N --ppn 1`), run on the cluster
    with its Hydra as that mpiexec: each node's local directory gets its own copy, the host's gets none."""
    from galapagos.launch.scripts.stage import pack_environment, stage_cleanup, stage_dir, stage_lines

    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "python").write_text("#!/bin/sh\n")
    data = tmp_path / "d.h5"
    data.write_bytes(os.urandom(1 << 20))
    tar = pack_environment(prefix, tmp_path / "job")
    hydra = " ".join(cluster.mpiexec_argv([], ppn=1)[:-2])  # without -n: the script's own line gives it
    script = "\n".join(["set -euo pipefail", "export PBS_JOBID=77.cluster", f"mpiexec() {{ {hydra} \"$@\"; }}",
                        stage_dir("pbs", LOCAL), *stage_lines("pbs", 4, tar, data),
                        'ls -R "$stage" > "$1/listing-$(hostname)"  # the first node, where the job runs',
                        'until [ -e "$1/go" ]; do sleep 0.05; done', stage_cleanup("pbs", 4), ""])
    (tmp_path / "stage.sh").write_text(script)
    proc = cluster.popen(0, ["bash", tmp_path / "stage.sh", tmp_path], env=cluster.mpi_env(), text=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 40
        while not (tmp_path / "listing-node0").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        staged = {h: sorted(p.relative_to(cluster.node(h).local).as_posix()
                            for p in cluster.node(h).local.rglob("*")) for h in cluster.hosts}
        on_host = os.listdir(LOCAL)
        copies = [(cluster.node(h).local / "galapagos-77.cluster" / "d.h5").read_bytes() == data.read_bytes()
                  for h in cluster.hosts if staged[h]]
        (tmp_path / "go").write_text("")
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, f"{out}\n{err}"
    want = ["galapagos-77.cluster", "galapagos-77.cluster/d.h5", "galapagos-77.cluster/venv",
            "galapagos-77.cluster/venv/bin", "galapagos-77.cluster/venv/bin/python"]
    assert all(files == want for files in staged.values()), staged
    assert copies == [True] * 4
    assert not [f for f in on_host if f.startswith("galapagos-")], on_host  # the host's directory has no copy
    left = {h: [p.name for p in cluster.node(h).local.iterdir()] for h in cluster.hosts}
    assert not any(left.values()), left  # removed after the run


@pytest.mark.timeout(60)
def test_teardown_leaves_no_process_namespace_or_claim(tmp_path):
    if (why := cluster_problem()) is not None:
        pytest.skip(why)
    links = set(os.listdir("/sys/class/net"))
    with Cluster(2, name="td") as c:
        assert c.run("td1", ["hostname"]).stdout.strip() == "td1"
        assert c.run(0, ["sh", "-c", f"find {LOCAL} /dev/shm -mindepth 1 | wc -l"]).stdout.strip() == "0"
        sleeper = c.popen(1, ["sleep", "300"], start_new_session=True)
        spaces = set().union(*(n.namespaces() for n in c.nodes))
        claim, directory = Path("/tmp/galapagos-clusters", str(c.subnet)), c.dir
        assert claim.exists() and directory.exists()
        assert not {"br0", "v0", "v1"} & (set(os.listdir("/sys/class/net")) - links)  # no link in the root ns
        refused = subprocess.run([c.launcher, "-x", "nosuchnode", "true"], capture_output=True, text=True, check=False)
        assert (refused.returncode, refused.stderr) == (255, "cluster launcher: no node named nosuchnode in td0 td1\n")
    assert sleeper.wait(timeout=5) == -9
    assert pids_in(spaces) == [] and not claim.exists() and not directory.exists()


def test_a_node_that_cannot_be_made_is_one_error_and_leaves_nothing():
    if (why := cluster_problem()) is not None:
        pytest.skip(why)
    c = Cluster(2, name="n" * 70)  # a hostname longer than the kernel's 64 characters
    with pytest.raises(ClusterError, match=r"^cluster \d+: n{70}0 failed before 'made': hostname: "):
        c.start()
    assert c.nodes == [] and c.dir is None and c.subnet is None
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).count("n" * 70)]
    assert not left, left  # the holders and the switch are gone


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""
