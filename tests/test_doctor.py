"""`galapagos doctor` and the MPI checks of launch/mpi.py, with the real MPI library of this installation (the pip
mpich wheel, which speaks PMI-1/PMI-2 only and has no Slingshot provider) and real processes: a launcher's
environment is what a task of srun --mpi=cray_shasta, PALS mpiexec (PBS) or a PMIx launcher (Aurora) would see, and
the node's fabric is a sysfs tree built in tmp_path. --ranks runs real ranks: on this machine, and across two nodes of
the namespace cluster (tests/cluster.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import REPO, describe_run, mpiexec

from galapagos.launch.doctor import diagnose
from galapagos.launch.netcheck import compare, node_fabric

SCRIPTS = Path(__file__).parent / "mpi_scripts"
# what any launcher or batch system leaves in an environment: none of it may leak into these tests
FOREIGN = ("PMI_", "PMIX_", "PALS_", "SLURM_", "PBS_", "FLUX_", "OMPI_", "LSB_", "JSM_", "ALPS_", "MPIR_CVAR",
           "FI_PROVIDER", "UCX_", "GALAPAGOS_SITE", "GALAPAGOS_RANKS_PER_NODE")
# a task of `srun --mpi=cray_shasta` (https://slurm.schedmd.com/mpi_guide.html): Slurm's step and Cray PMI's PALS vars
CRAY_SHASTA = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4",
               "SLURM_MPI_TYPE": "cray_shasta", "PALS_RANKID": "0", "PALS_NODEID": "0", "PALS_APID": "77.0"}
# a rank of PALS mpiexec in a PBS job (Polaris): Cray PMI's variables
PALS = {"PBS_JOBID": "88.polaris-pbs-01", "PALS_RANKID": "0", "PALS_NODEID": "0", "PALS_APID": "abc",
        "PMI_RANK": "0", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "4"}
# a rank of a PMIx launcher (Aurora's PALS mpiexec --pmi=pmix)
PMIX = {"PBS_JOBID": "99.aurora-pbs-0001", "PMIX_NAMESPACE": "99.aurora", "PMIX_RANK": "0",
        "PMIX_SERVER_URI41": "pmix-server.1;tcp4://127.0.0.1:1"}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def galapagos(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "galapagos.cli", *args], cwd=REPO, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


# -- a wheel MPI under a Cray launcher -------------------------------------------------------------------------------
def test_before_launch_refuses_the_wheel_under_srun_cray_shasta():
    """A Slurm job script that starts its ranks with srun --mpi=cray_shasta, checked on its batch node."""
    proc = galapagos("doctor", "--before-launch", "--launcher", "srun", "--pmi", "cray_shasta",
                     env=clean_env(SLURM_JOB_ID="77"))
    assert proc.returncode == 2, describe_run(proc)
    line = one_line(proc.stderr)
    assert "cray_shasta" in line and "the pip mpich wheel" in line
    assert "--srun-mpi pmi2" in line and "--launcher mpiexec" in line  # the fixes srun's scheduler accepts
    assert not proc.stdout


def test_a_rank_of_srun_cray_shasta_is_told_the_mismatch():
    proc = galapagos("doctor", "--json", env=clean_env(**CRAY_SHASTA))
    assert proc.returncode == 2, describe_run(proc)
    found = json.loads(proc.stdout)
    assert found["launcher"]["pmi"] == "cray_shasta" and found["library"]["kind"] == "mpich-wheel"
    assert len(found["errors"]) == 1 and "--srun-mpi pmi2" in found["errors"][0]


def test_before_launch_under_pbs_names_a_fix_pbs_accepts():
    """PALS mpiexec is the only launcher of a PBS job: no --launcher mpiexec, no srun option in the fix."""
    proc = galapagos("doctor", "--before-launch", env=clean_env(PBS_JOBID="88.polaris-pbs-01"))
    assert proc.returncode == 2, describe_run(proc)
    line = one_line(proc.stderr)
    assert "PALS mpiexec serves Cray PMI" in line and "galapagos setup --site" in line
    assert "--launcher mpiexec" not in line and "--srun-mpi" not in line


@pytest.mark.parametrize("site", ["frontier", "polaris", "aurora", "perlmutter"])
def test_before_launch_with_a_cray_site_profile(site):
    proc = galapagos("doctor", "--before-launch", "--site", site)
    assert proc.returncode == 2, describe_run(proc)
    assert f"galapagos setup --site {site}" in one_line(proc.stderr)


def test_before_launch_passes_the_wheel_under_its_own_hydra():
    proc = galapagos("doctor", "--before-launch", "--site", "workstation")
    assert proc.returncode == 0 and not proc.stderr.strip(), describe_run(proc)


def test_bad_site_is_one_line():
    proc = galapagos("doctor", "--site", "no-such-machine")
    assert proc.returncode == 2 and "--site no-such-machine: no bundled profile" in one_line(proc.stderr)


# -- PMIx offered, PMI-1 spoken --------------------------------------------------------------------------------------
def test_pmix_launcher_with_the_pmi1_wheel_is_a_mismatch():
    proc = galapagos("doctor", "--json", env=clean_env(**PMIX))
    assert proc.returncode == 2, describe_run(proc)
    found = json.loads(proc.stdout)
    assert found["launcher"]["pmi"] == "pmix" and "PMIx" in found["errors"][0]


def test_world_stops_before_mpi_init_under_pmix():
    """Aurora: MPICH without PMIx aborts in MPI_Init under a PMIx launcher; world() says so in one line first."""
    proc = subprocess.run([sys.executable, SCRIPTS / "world_pmix.py"], env=clean_env(**PMIX), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, describe_run(proc)
    line = one_line(proc.stderr + proc.stdout)
    assert "serves PMIx" in line and "MPI_Init would abort" in line and "galapagos setup --site" in line
    plain = subprocess.run([sys.executable, SCRIPTS / "world_pmix.py"], env=clean_env(), capture_output=True,
                           text=True, timeout=60)
    assert plain.returncode == 0 and "a world of 1" in plain.stdout, describe_run(plain)


def test_a_job_under_pmix_ends_in_one_line(tmp_path):
    proc = galapagos("evolve", "--data", str(tmp_path / "d.h5"), "--out", str(tmp_path / "run"),
                     env=clean_env(**PMIX))
    assert proc.returncode == 2, describe_run(proc)
    assert "serves PMIx" in one_line(proc.stderr) and "Traceback" not in proc.stderr


def test_singletons_under_pals_get_a_fix_pbs_accepts(tmp_path):
    """Four PALS ranks of the wheel, each an MPI world of one: the hint names no Slurm-only fix."""
    proc = galapagos("evolve", "--data", str(tmp_path / "d.h5"), "--out", str(tmp_path / "run"),
                     env=clean_env(**PALS))
    assert proc.returncode == 2, describe_run(proc)
    line = one_line(proc.stderr)
    assert "MPI is not wired: the launcher started 4 tasks (PMI_SIZE=4)" in line and "Cray MPICH" in line
    assert "--launcher mpiexec" not in line and "--srun-mpi" not in line


# -- the network against the fabric ----------------------------------------------------------------------------------
def fake_node(root: Path, cls: str, names: list[str], driver: str | None = None) -> Path:
    for name in names:
        dev = root / "sys/class" / cls / name / "device"
        dev.mkdir(parents=True)
        if driver:
            (root / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            (dev / "driver").symlink_to(root / "drivers" / driver)
    (root / "dev/shm").mkdir(parents=True, exist_ok=True)
    return root


def test_tcp_on_slingshot_is_a_warning_with_its_cost(tmp_path):
    root = fake_node(tmp_path, "cxi", ["cxi0", "cxi1"])
    report = diagnose(env=clean_env(), root=root)
    assert report.facts["network"]["fabric"] == "cxi" and report.facts["network"]["transport"] == "tcp"
    (warning,) = [w for w in report.warnings if w.startswith("network:")]
    assert "Slingshot-11" in warning and "~1-3 GB/s against ~25 GB/s" in warning and "~10x" in warning
    assert "galapagos setup --site" in warning
    site = {"name": "frontier", "mpi": {"network": "cxi", "fabric": "Slingshot-11 (4 NICs)", "bandwidth_gbs": 25.0}}
    (warning,) = diagnose(site, env=clean_env(), root=root, launcher="mpiexec").warnings
    assert "Slingshot-11 (4 NICs)" in warning and "galapagos setup --site frontier" in warning


def test_infiniband_through_ucx_is_fast_unless_ucx_is_told_tcp(tmp_path):
    root = fake_node(tmp_path, "infiniband", ["mlx5_0"], driver="mlx5_core")
    report = diagnose(env=clean_env(), root=root)
    assert report.facts["network"]["transport"] == "ucx" and not report.warnings
    report = diagnose(env=clean_env(UCX_TLS="tcp,self"), root=root)
    assert report.facts["network"]["transport"] == "tcp"
    assert any("InfiniBand" in w and "UCX_TLS=tcp,self" in w for w in report.warnings)


def test_fabrics_from_sysfs(tmp_path):
    assert node_fabric(tmp_path) == ("none", [])
    assert node_fabric(fake_node(tmp_path / "efa", "infiniband", ["rdmap0s6"], driver="efa")) == ("efa", ["rdmap0s6"])
    assert node_fabric(fake_node(tmp_path / "ib", "infiniband", ["mlx5_1", "mlx5_0"])) == (
        "infiniband", ["mlx5_0", "mlx5_1"])
    assert node_fabric(fake_node(tmp_path / "ss", "cxi", ["cxi0"]))[0] == "cxi"


def test_node_local_storage_missing_names_the_directive(tmp_path):
    root = fake_node(tmp_path, "cxi", ["cxi0"])
    site = {"storage": {"local": "/mnt/bb/$GALAPAGOS_TEST_USER", "directive": "-C nvme"}}
    os.environ["GALAPAGOS_TEST_USER"] = "someone"
    try:
        report = diagnose(site, env=clean_env(), root=root, launcher="mpiexec")
        assert any("/mnt/bb/someone" in w and "-C nvme" in w for w in report.warnings)
        (root / "mnt/bb/someone").mkdir(parents=True)
        report = diagnose(site, env=clean_env(), root=root, launcher="mpiexec")
    finally:
        del os.environ["GALAPAGOS_TEST_USER"]
    assert report.facts["storage"]["local"]["exists"] and not any("storage" in w for w in report.warnings)


# -- --json and --ranks ----------------------------------------------------------------------------------------------
def test_json_is_one_object_with_every_section():
    proc = galapagos("doctor", "--json")
    assert proc.returncode == 0, describe_run(proc)
    found = json.loads(proc.stdout)
    assert {"library", "launcher", "network", "gpus", "storage", "errors", "warnings", "ok"} <= set(found)
    assert found["library"]["kind"] == "mpich-wheel" and found["library"]["path"].endswith(".so.12")
    assert "--with-device=ch4" in found["library"]["configure"]
    assert found["launcher"] == {"scheduler": "local", "launcher": "mpiexec (Hydra)", "pmi": "pmi1",
                                 "how": "the launcher's own"}
    assert found["gpus"]["count"] == 0 and found["storage"]["shm"]["exists"] and found["ok"] is True


@pytest.mark.mpi
def test_ranks_two_on_this_machine():
    mpiexec()
    proc = galapagos("doctor", "--ranks", "2", "--json")
    assert proc.returncode == 0, describe_run(proc)
    ranks = json.loads(proc.stdout)["ranks"]
    assert ranks["ranks"] == 2 and ranks["nodes"] == 1 and ranks["pairs"] == []
    assert ranks["same_node"]["bandwidth_gbs"] > 0 and ranks["same_node"]["latency_us"] > 0
    assert ranks["expected"]["source"] == "the same node, this run"
    split = galapagos("doctor", "--ranks", "2", "--json", env=clean_env(GALAPAGOS_RANKS_PER_NODE="1"))
    assert split.returncode == 0, describe_run(split)
    ranks = json.loads(split.stdout)["ranks"]
    assert ranks["nodes"] == 2 and len(ranks["pairs"]) == 1 and ranks["pairs"][0]["bandwidth_gbs"] > 0


@pytest.mark.mpi
def test_ranks_under_a_launcher_print_once():
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "galapagos.cli", "doctor", "--ranks", "3",
                           "--json"], cwd=REPO, env=clean_env(GALAPAGOS_RANKS_PER_NODE="1"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, describe_run(proc)
    ranks = json.loads(proc.stdout)["ranks"]  # one object: the other ranks print nothing
    assert ranks["nodes"] == 3 and len(ranks["pairs"]) == 2  # (0, 1) at once, then rank 0's node with the odd one


def test_ranks_needs_two():
    proc = galapagos("doctor", "--ranks", "1")
    assert proc.returncode == 2 and "--ranks 1: the network run needs at least 2 ranks" in proc.stdout


def test_measured_figures_against_the_sites_fabric():
    result = {"pairs": [{"between": ["n0", "n1"], "bandwidth_gbs": 2.0, "latency_us": 30.0},
                        {"between": ["n2", "n3"], "bandwidth_gbs": 22.0, "latency_us": 2.0}],
              "same_node": {"bandwidth_gbs": 10.0, "latency_us": 0.5}}
    site = {"mpi": {"fabric": "Slingshot-11", "bandwidth_gbs": 25.0, "latency_us": 2.5}}
    expected, warnings = compare(result, site)
    assert expected["bandwidth_gbs"] == 25.0 and "Slingshot-11" in expected["source"]
    assert len(warnings) == 2 and "between n0 and n1" in warnings[0] and "8% of the 25 GB/s" in warnings[0]
    expected, warnings = compare(result, {})
    assert expected["bandwidth_gbs"] == 10.0 and warnings == []


@pytest.mark.mpi
def test_ranks_across_two_nodes_of_the_namespace_cluster():
    from cluster import Cluster, cluster_problem

    if (why := cluster_problem()) is not None:
        pytest.skip(why)
    with Cluster(2, name="dnode") as c:
        proc = c.mpiexec([sys.executable, "-m", "galapagos.cli", "doctor", "--ranks", "2", "--json"],
                         env=clean_env(), cwd=REPO, timeout=120)
    assert proc.returncode == 0, describe_run(proc)
    found = json.loads(proc.stdout)
    ranks = found["ranks"]
    assert ranks["hosts"] == ["dnode0", "dnode1"] and ranks["pairs"][0]["between"] == ["dnode0", "dnode1"]
    assert ranks["pairs"][0]["bandwidth_gbs"] > 0 and ranks["same_node"] is None
    assert found["network"]["transport"] == "tcp" and "UCX_TLS" in found["network"]["how"]
