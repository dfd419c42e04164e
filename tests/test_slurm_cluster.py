"""Real multi-node jobs: `galapagos launch --scheduler slurm --nodes 4 --submit` on a Slurm cluster of four namespace
nodes on this machine (tests/slurm_cluster.py on tests/cluster.py), each node with its own hostname, address,
/dev/shm and node-local directory, one slurmd each under one slurmctld.

The jobs run CPU-only workers, one per node, and rank 0 beside the first node's worker (the host list the script
writes). Both launchers of tests/test_slurm.py are run: the mpich wheel's Hydra mpiexec inside the allocation
(its proxies started by srun) and srun itself serving PMI-2 (--srun-mpi pmi2). The latter can hang in MPI_Init
across nodes with the pip MPICH when a PMI-1 request outgrows the 1024 bytes Slurm's pmi2 plugin reads at once
(test_slurm.py's docstring). On this cluster it has not hung: 30 of 30 runs of 5 and 9 ranks across the 4 nodes
started (Slurm 22.05, mpich 5.0.2 wheel, UCX over TCP), so both launchers are tested.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from galapagos.examples import shapes
from tests.cluster import LOCAL, MPI_ENV, Cluster, cluster_problem
from tests.mpirun import REPO
from tests.slurm_cluster import SlurmCluster, slurm_problem, start_slurm
from tests.test_jobscript import launch_line, ranks_text
from tests.test_slurm import TINY

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

NODES = 4
LAUNCHERS = {"mpiexec": ("--launcher", "mpiexec"), "srun-pmi2": ("--srun-mpi", "pmi2")}
BIN = Path(sys.executable).parent  # this venv's bin/: its galapagos, activate, mpiexec


def noting_train(payload, ctx):
    """Real training, after noting where this trainer runs: its node, its interpreter's environment, and what the
    staging directory it runs from holds (the directory GALAPAGOS_TEST_WHERE names collects the notes)."""
    from galapagos.evolve.train import train_task

    note = {"host": socket.gethostname(), "prefix": sys.prefix, "beside": sorted(os.listdir(Path(sys.prefix).parent))}
    where = Path(os.environ["GALAPAGOS_TEST_WHERE"])
    (where / f"{note['host']}-{os.getpid()}.json").write_text(json.dumps(note))
    return train_task(payload, ctx)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    problem = cluster_problem() or slurm_problem()
    if problem:
        pytest.skip(problem)
    with Cluster(NODES) as machines:
        try:
            cluster = start_slurm(machines, tmp_path_factory.mktemp("slurm"))
        except RuntimeError as exc:  # the daemons' logs follow the first line
            pytest.skip(f"the {NODES}-node Slurm cluster did not start: {str(exc).splitlines()[0]}")
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=300, size=12, seed=1)
    return path


def galapagos(slurm: SlurmCluster, *args, python: Path = Path(sys.executable), env: dict | None = None) -> str:
    """`galapagos ARGS` (run by `python`) as on the cluster's login node, node 0; its output, once it succeeded."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    proc = subprocess.run(slurm.on_login([python, "-m", "galapagos.cli", *map(str, args)], cwd=REPO),
                          env={**clean, "SLURM_CONF": str(slurm.conf), **(env or {})}, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def submit(slurm: SlurmCluster, *args, python: Path = Path(sys.executable), env: dict | None = None
           ) -> tuple[Path, str]:
    """`galapagos launch --scheduler slurm --nodes 4 ... --submit ARGS`: the script and its job id. The ranks' MPICH
    talks between nodes over TCP on eth0 (MPI_ENV: else UCX finds the other nodes on the same kernel and skips the
    network)."""
    mpi = [w for k, v in MPI_ENV.items() for w in ("--env", f"{k}={v}")]
    said = galapagos(slurm, "launch", "--scheduler", "slurm", "--nodes", NODES, "--gpus-per-node", 0,
                     "--workers-per-node", 1, "--env", f"PYTHONPATH={REPO}", *mpi, "--submit", *args, python=python,
                     env=env)
    script = Path(re.search(r"^script: (.+)$", said, re.MULTILINE).group(1))
    return script, re.search(r"^submitted: slurm job (\d+)$", said, re.MULTILINE).group(1)


def finished(slurm: SlurmCluster, script: Path, job: str) -> str:
    """The job's output, once it ended; it must have completed with exit code 0."""
    info = slurm.wait(job, 150)
    log = (script.parent / f"{script.stem}-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{log}\n{slurm.logs()}"
    return log


def journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines()]


def placed(records: list[dict]) -> dict[int, str]:
    """Worker rank -> node, from a journal; every worker's rank always on the same node."""
    hosts = {}
    for r in records:
        assert hosts.setdefault(r["rank"], r["host"]) == r["host"], r
    return hosts


def noting_program(tmp: Path) -> tuple[Path, Path]:
    """A --program that notes the node each rank starts on (PMI_RANK, which Hydra and srun's pmi2 both set; the
    script's own calls, outside the ranks, have none) and then runs this installation's galapagos; and the folder
    of the notes."""
    ranks = tmp / "ranks"
    ranks.mkdir()
    program = tmp / "galapagos-noting"
    program.write_text(f'#!/bin/sh\n[ -z "$PMI_RANK" ] || hostname >"{ranks}/$PMI_RANK"\n'
                       f'exec "{BIN}/galapagos" "$@"\n')
    program.chmod(0o755)
    return program, ranks


def started(ranks: Path) -> dict[int, str]:
    """MPI rank -> the node it started on, from the notes of noting_program."""
    return {int(p.name): p.read_text().strip() for p in ranks.iterdir()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher", LAUNCHERS, ids=list(LAUNCHERS))
def test_four_node_evolve_then_ensemble(slurm, data, tmp_path, launcher):
    nodes, first = slurm.names, slurm.names[0]
    workers = {i + 1: n for i, n in enumerate(nodes)}  # one worker per node, in the nodes' order
    program, ranks = noting_program(tmp_path)
    how = (*LAUNCHERS[launcher], "--setup", f"source {BIN}/activate", "--program", program)
    out = tmp_path / "run"
    script, job = submit(slurm, *how, "--", "galapagos", "evolve", "--data", data, "--out", out, "--evaluations", 8,
                         *TINY)
    text = script.read_text()
    assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks=5" in text
    assert 'export SLURM_HOSTFILE="$job_dir/hosts-$SLURM_JOB_ID"' in ranks_text(text) and "--no-kill" in text
    line = launch_line(text)  # in the ranks file galapagos supervise runs, for the 4 nodes
    if launcher == "mpiexec":
        assert re.search(r'mpiexec -n 5 -f "\$SLURM_HOSTFILE" "\$\{command\[@\]\}"', line), line
    else:
        assert re.search(r"^srun --ntasks=5 --distribution=arbitrary .*--mpi=pmi2 ", line), line
    log = finished(slurm, script, job)
    # the host list: the first node twice over (rank 0 and its worker), then one worker per node
    assert (script.parent / f"hosts-{job}").read_text().split() == [first, *nodes]
    assert started(ranks) == {0: first, **workers}, log  # rank 0 beside node 0's worker, then one per node
    records = journal(out)
    assert len(records) == 8 and all(r["status"] == "ok" for r in records), log
    assert placed(records) == workers  # every node's worker trained
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluations"] == 8 and summary["workers"] == 4 and "stopped_by" not in summary
    assert f"on {NODES} node(s)" in log and "best network:" in log
    assert (out / "best" / "model.pt").exists()

    for p in ranks.iterdir():
        p.unlink()
    ens = tmp_path / "ensemble"
    script, job = submit(slurm, *how, "--", "galapagos", "ensemble", "--from", out, "--data", data, "--out", ens,
                         "--members", 4)
    log = finished(slurm, script, job)
    assert started(ranks) == {0: first, **workers}, log
    members = journal(ens)
    assert len(members) == 4 and all(r["status"] == "ok" for r in members), log
    assert placed(members) == workers  # one member each
    manifest = json.loads((ens / "ensemble.json").read_text())
    assert len(manifest["members"]) == 4 and (ens / "metrics.json").exists()
    assert "ensemble directory:" in log


def thin_environment(where: Path) -> Path:
    """What `--stage` packs and copies here: a venv with this one's MPI library (lib/, 32 MB: mpi4py loads it from
    sys.prefix) whose Python packages are this one's (a .pth file adds its site-packages). The whole environment
    (1.4 GB with torch) would fill every node's local directory, a tmpfs in memory, four times over; the copy's
    interpreter, venv, MPI library and the data are still each node's own."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where], check=True, timeout=120)
    for lib in (BIN.parent / "lib").iterdir():
        if lib.is_dir() and not lib.is_symlink():
            if not lib.name.startswith("python"):
                shutil.copytree(lib, where / "lib" / lib.name, symlinks=True)
        else:
            shutil.copy2(lib, where / "lib" / lib.name, follow_symlinks=False)
    shared = next(BIN.parent.glob("lib/python*/site-packages"))
    (next(where.glob("lib/python*/site-packages")) / "shared.pth").write_text(
        f"import site; site.addsitedir({str(shared)!r})\n")
    return where / "bin" / "python"


@pytest.mark.timeout(240)
def test_staged_four_node_evolve_runs_from_each_nodes_copy(slurm, data, tmp_path):
    """--stage: sbcast puts the packed environment and the data in every node's own local directory, the ranks
    run from there, and the copies are gone after the job."""
    python = thin_environment(tmp_path / "thin")
    notes = tmp_path / "notes"
    notes.mkdir()
    out = tmp_path / "run"
    script, job = submit(slurm, *LAUNCHERS["mpiexec"], "--stage", LOCAL, "--env", f"GALAPAGOS_TEST_WHERE={notes}",
                         "--", "galapagos", "evolve", "--data", data, "--out", out, "--evaluations", 4, *TINY,
                         "--set", "run.task='tests.test_slurm_cluster:noting_train'",
                         python=python, env={"GALAPAGOS_MPIEXEC": str(BIN / "mpiexec")})
    text = script.read_text()
    assert [line.split()[0] for line in text.splitlines() if line.startswith("sbcast ")] == ["sbcast", "sbcast"]
    log = finished(slurm, script, job)
    copy = f"{LOCAL}/galapagos-{job}"
    assert f"for {copy}/{data.name} " in log  # rank 0 read the data from its node's copy
    seen = [json.loads(p.read_text()) for p in notes.iterdir()]
    assert {s["host"] for s in seen} == set(slurm.names), seen  # a trainer on every node
    for s in seen:  # each ran the staged interpreter, beside the staged data, on its own node
        assert s["prefix"] == f"{copy}/thin" and data.name in s["beside"], s
    records = journal(out)
    assert len(records) == 4 and all(r["status"] == "ok" for r in records), log
    for node in slurm.nodes:  # the copies are removed after the run
        assert not node.local.joinpath(f"galapagos-{job}").exists(), (node.name, os.listdir(node.local))
