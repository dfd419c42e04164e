"""Site profiles: every bundled profile loads, states its MPI route consistently, and renders a job script that loads
its modules and starts the ranks with its launcher and PMI; the centres' rules (queue limits, QOS queues, queues
without follow-ups, node-local storage's directive, PALS, a retired machine) each on the rendered script; and
`galapagos setup`, printed for every centre and run for real on a workstation."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from galapagos.cli import main
from galapagos.launch.scripts import (SCHEDULERS, JobScriptError, apply_site, build_request, bundled_sites,
                                      check_queue_limits, find_site, load_site, parse_walltime, render, smt_level)
from galapagos.launch.scripts.sites import LAUNCHERS, bundled_dir
from tests.mpirun import REPO
from tests.test_jobscript import (check_erf, data, directives, launch, launch_line, srun_rules,  # noqa: F401
                                  supervise_line, written)

NAMES = bundled_sites()
LIVE = [n for n in NAMES if "retired" not in load_site(n)]
CENTRES = [n for n in LIVE if not n.startswith("generic-") and n != "workstation"]
GEOMETRY = {"gpus_per_node": ["--gpus-per-node", 4], "cpus_per_node": ["--cpus-per-node", 40]}


def test_the_repository_and_the_installed_profiles_are_the_same_files():
    assert {p.stem for p in (REPO / "examples" / "sites").glob("*.toml")} == set(NAMES)
    assert bundled_dir().resolve() == (REPO / "examples" / "sites").resolve()  # the editable install's package data


def _queue_for(profile: dict, nodes: int) -> list[str] | None:
    """Options that send `nodes` nodes to a queue of the profile that takes them, with a wall time it allows: the
    profile's own queue and wall time where they fit; None if no queue takes that many nodes."""
    default = profile.get("queue")
    own = parse_walltime(profile["walltime"]) if "walltime" in profile else None
    for name in [default, *profile.get("queues", {})]:
        for wall in (own, 1800):
            try:
                check_queue_limits(profile, nodes, wall, [name] if name else [])
            except JobScriptError:
                continue
            return [*(["--queue", name] if name else []), *(["--walltime", str(wall // 60)] if wall else [])]
    return None


def _check_route(profile: dict, text: str, nodes: int) -> None:
    """The script loads the route's modules (in order) before `set -u`, exports its environment, and starts the
    ranks with its launcher and PMI."""
    mpi, lines, line = profile["mpi"], text.splitlines(), launch_line(text)
    nounset = next(i for i, x in enumerate(lines) if x.startswith("set -u "))
    wanted = [*(f"module use {m}" for m in mpi.get("module_use", [])),
              *(f"module unload {m[1:]}" if m.startswith("-") else f"module load {m}" for m in mpi.get("modules", []))]
    at = [lines.index(x) for x in wanted]
    assert at == sorted(at) and all(i < nounset for i in at), (wanted, at, nounset)
    for key, value in mpi.get("env", {}).items():
        assert f'export {key}="{value}"' in lines
    scheduler = profile["scheduler"]
    if mpi["launcher"] == "srun":
        plugin = mpi.get("srun", mpi["pmi"])
        assert f"--mpi={plugin}" in shlex.split(line) and line.startswith("srun ")
        assert nodes == 1 or "--distribution=arbitrary" in line
    elif mpi["launcher"] == "pals":
        assert line.startswith("mpiexec --cpu-bind none") and "is not HPE Cray PALS's" in text
        assert not re.search(r"--hosts?\b|-f |(?<!-)-ppn ", line)  # PALS's own flags only
        assert line.count('--hostfile "$node_file"') == 1  # the nodes that answer (galapagos supervise)
    elif mpi["launcher"] == "flux":
        assert line.startswith(f"flux run -N {nodes} ")
    elif mpi["launcher"] == "jsrun":
        assert line.startswith("jsrun --erf_input")
    else:
        assert scheduler == "local" and Path(shlex.split(line)[0]).name in ("mpiexec", "mpirun")


@pytest.mark.parametrize("name", LIVE)
def test_every_profile_states_its_route_and_renders_a_typical_job(name, data, tmp_path, capsys):  # noqa: F811
    """Each bundled profile loads by name; its [mpi] route is complete and fits its scheduler; a job of 2 nodes and
    one of the largest size its queues take render as valid shell with the route's modules, environment, launcher
    and PMI; the machine's limits are enforced."""
    profile = load_site(name)
    mpi = profile["mpi"]
    assert {"route", "launcher", "pmi", "library", "doc", "python"} <= set(mpi), name
    assert mpi["launcher"] in LAUNCHERS[profile["scheduler"]]
    assert (mpi["route"] == "wheel") == (name == "workstation")  # the wheel MPICH: only where no site MPI exists
    if name in CENTRES:
        assert {"network", "fabric", "bandwidth_gbs", "latency_us"} <= set(mpi) and mpi["doc"].startswith("https://")
        assert "https://" in find_site(name).read_text().split("[mpi]")[0]  # the machine's numbers are cited
        assert mpi["route"] == "system" or mpi.get("install", "").startswith("MPICC=")
    extra = [x for key, flag in GEOMETRY.items() if key not in profile for x in flag]
    machine = profile.get("machine", {}).get("max_nodes", 2)
    sizes = sorted({machine, *(q.get("max_nodes", machine) for q in profile.get("queues", {}).values())})[::-1]
    full = next((n for n in sizes if _queue_for(profile, n) is not None), 2)
    for nodes in sorted({min(2, machine), full}):
        out_dir = tmp_path / f"run{nodes}"
        code, out, err = launch(capsys, "--site", name, "--nodes", nodes, *extra, *(_queue_for(profile, nodes) or []),
                                "--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10)
        assert code == 0, (name, nodes, err)
        script = written(out)[0]
        subprocess.run(["bash", "-n", str(script)], check=True)
        text = script.read_text()
        gpus = profile.get("gpus_per_node", 4)
        assert f"{nodes * gpus} worker(s) + 1 master = {nodes * gpus + 1} MPI ranks" in text
        _check_route(profile, text, nodes)
        d = directives(text, SCHEDULERS[profile["scheduler"]].prefix)
        assert all(x in d for x in profile.get("directives", []))
        if "filesystems" in profile:  # ALCF: -l filesystems is mandatory
            assert f"-l filesystems={profile['filesystems']}" in d
        if profile["scheduler"] == "lsf":
            check_erf((script.parent / f"{script.stem}.erf").read_text(), nodes, gpus, gpus,
                      profile.get("cpus_per_node", 40), smt_level(profile.get("constraint")))
    if "machine" in profile:
        code, out, err = launch(capsys, "--site", name, "--nodes", machine + 1, *extra, "--", "evolve", "--data",
                                data, "--out", tmp_path / "over", "--evaluations", 10)
        assert code == 2 and f"has only {machine}" in err


def test_a_profile_is_found_by_name_or_by_path(tmp_path, capsys):
    assert find_site("frontier") == bundled_dir() / "frontier.toml"
    own = tmp_path / "mine.toml"
    own.write_text('scheduler = "slurm"\n')
    assert find_site(own) == own and load_site(str(own))["name"] == "mine"
    with pytest.raises(JobScriptError, match=r"--site frontire: no bundled profile of that name; bundled: alps, "
                                             r"aurora, .*workstation \(or give the path"):
        find_site("frontire")
    code, _, err = launch(capsys, "--site", "frontire", "--nodes", 1, "--", "evolve", "--data", "x", "--out", "y")
    assert code == 2 and err.count("\n") == 1 and "bundled: alps" in err


def test_site_profile_checks(data, tmp_path, capsys):  # noqa: F811
    """A profile's unknown keys and bad values are one clear line each, naming the key."""
    cases = [('schedular = "slurm"\n', "unknown key 'schedular'"),
             ('[queues.prod]\nmaxnodes = 4\n', "unknown key queues.prod.maxnodes"),
             ('[queues.prod]\nmax_nodes = "many"\n', "queues.prod.max_nodes must be a whole number"),
             ('[queues.prod]\nmax_walltime = "soon"\n', "queues.prod.max_walltime 'soon': expected"),
             ('[queues.prod]\nbins = [{ max_nodes = 4 }]\n', "queues.prod.bins[0] needs max_nodes and max_walltime"),
             ('directives = "--x"\n', "directives must be a list of strings"),
             ('[queues.debug]\nchain = "no"\n', "queues.debug.chain must be true or false"),
             ('scheduler = "pbs"\n[queues.debug]\nqos = true\n', "queues.debug.qos: only Slurm has a quality"),
             ('[mpi]\nroute = "magic"\n', "mpi.route 'magic': expected one of wheel, cray-mpich-abi, build, system"),
             ('[mpi]\nrout = "build"\n', "unknown key mpi.rout"),
             ('scheduler = "pbs"\n[mpi]\nlauncher = "srun"\n', "mpi.launcher 'srun' does not start ranks under the "
                                                               "pbs scheduler (it uses pals)"),
             ('scheduler = "slurm"\n[mpi]\nlauncher = "srun"\npmi = "pals"\n', "mpi.pmi 'pals': srun serves"),
             ('[mpi]\nmodules = "PrgEnv-gnu"\n', "mpi.modules must be a list of module names"),
             ('[mpi]\nbandwidth_gbs = -1\n', "mpi.bandwidth_gbs must be a number above zero"),
             ('[mpi.env]\nMPICH_GPU_SUPPORT_ENABLED = 0\n', "mpi.env.MPICH_GPU_SUPPORT_ENABLED: expected"),
             ('[storage]\nlocale = "/tmp"\n', "unknown key storage.locale"),
             ('retired = "last year"\n', "retired 'last year': expected a date")]
    for i, (toml, words) in enumerate(cases):
        bad = tmp_path / f"bad{i}.toml"
        bad.write_text(toml)
        code, _, err = launch(capsys, "--site", bad, "--nodes", 1, "--", "evolve", "--data", data, "--out",
                              tmp_path / "b", "--evaluations", 10)
        assert code == 2 and words in err and err.count("\n") == 1 and str(bad) in err, (toml, err)
    good = tmp_path / "dated.toml"
    good.write_text("retired = 2024-11-15\n")  # a TOML date works as well as a string
    assert load_site(good)["retired"] == "2024-11-15"


def test_queue_limits_are_refused_with_one_line(data, tmp_path, capsys):  # noqa: F811
    """A site's [queues.NAME] limits (node range, wall time, wall time by job size) are checked before anything is
    written, each refusal one line naming the queue and its limit."""
    out_dir = tmp_path / "run"
    ok = ["--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10]
    cases = [
        (["polaris", "--nodes", 560], "--nodes 560: queue prod takes 10 to 496 nodes"),
        (["polaris", "--nodes", 4], "--nodes 4: queue prod takes 10 to 496 nodes"),
        (["polaris", "--nodes", 64, "--walltime", "08:00"],
         "--walltime 08:00:00: queue prod allows at most 06:00:00 for jobs of 25 to 99 nodes"),
        (["polaris", "--nodes", 2, "--queue", "debug", "--walltime", "00:03"],
         "--walltime 00:03:00: queue debug needs at least 00:05:00"),
        (["polaris", "--nodes", 3, "--queue", "debug", "--walltime", "00:30"], "queue debug takes 1 to 2 nodes"),
        (["aurora", "--nodes", 4096], "--nodes 4096: queue prod takes 1 to 2048 nodes"),
        (["aurora", "--nodes", 600, "--walltime", "14:00"],
         "queue prod allows at most 12:00:00 for jobs of 513 to 1024 nodes"),
        (["aurora", "--nodes", 2, "--queue", "debug"], "--walltime 06:00:00: queue debug allows at most 01:00:00"),
        (["aurora", "--nodes", 40, "--queue", "debug-scaling", "--walltime", "00:30"],
         "queue debug-scaling takes 2 to 31 nodes"),
        (["frontier", "--nodes", 64, "--walltime", "04:00"],
         "--walltime 04:00:00: queue batch allows at most 02:00:00 for jobs of 1 to 91 nodes"),
        (["frontier", "--nodes", 100, "--queue", "extended", "--walltime", "10:00"],
         "queue extended takes 1 to 64 nodes"),
        (["frontier", "--nodes", 2, "--queue", "debug", "--walltime", "03:00"], "queue debug allows at most 02:00:00"),
        (["perlmutter", "--nodes", 16, "--queue", "debug", "--walltime", "00:20"], "queue debug takes 1 to 8 nodes"),
        (["perlmutter", "--nodes", 16, "--qos", "debug", "--walltime", "00:20"], "queue debug takes 1 to 8 nodes"),
        (["perlmutter", "--nodes", 16, "--walltime", "3-00:00"], "queue regular allows at most 48:00:00"),
        (["lumi", "--nodes", 8, "--queue", "small-g"], "queue small-g takes 1 to 4 nodes"),
    ]
    for (site, *args), words in cases:
        code, out, err = launch(capsys, "--site", site, *args, *ok)
        assert code == 2 and words in err and f"{site}.toml" in err, (site, args, err)
        assert err.count("\n") == 1 and not out_dir.exists(), (site, args, err)


def test_a_queue_that_is_a_qos_is_written_as_one(data, tmp_path, capsys):  # noqa: F811
    """NERSC: regular, debug, premium are QOS, not partitions (https://docs.nersc.gov/jobs/policy/)."""
    cases = [([], "regular"), (["--queue", "debug", "--walltime", "00:30"], "debug"),
             (["--qos", "premium"], "premium"), (["--queue", "premium"], "premium")]
    for i, (args, qos) in enumerate(cases):
        code, out, err = launch(capsys, "--site", "perlmutter", "--nodes", 2, *args, "--", "evolve", "--data", data,
                                "--out", tmp_path / f"r{i}", "--evaluations", 10)
        assert code == 0, (args, err)
        d = directives(written(out)[0].read_text(), "#SBATCH")
        assert f"--qos={qos}" in d and not any(x.startswith("--partition") for x in d), (args, d)
        assert sum(x.startswith("--qos") for x in d) == 1
    code, out, err = launch(capsys, "--site", "perlmutter", "--nodes", 2, "--queue", "debug", "--qos", "premium",
                            "--walltime", "00:30", "--", "evolve", "--data", data, "--out", tmp_path / "both",
                            "--evaluations", 10)
    assert code == 2 and "--queue debug is a QOS at this site" in err and err.count("\n") == 1
    code, out, err = launch(capsys, "--site", "frontier", "--nodes", 2, "--queue", "debug", "--walltime", "01:00",
                            "--", "evolve", "--data", data, "--out", tmp_path / "f", "--evaluations", 10)
    d = directives(written(out)[0].read_text(), "#SBATCH")  # Frontier: batch is a partition, debug a QOS
    assert code == 0 and "--qos=debug" in d and not any(x.startswith("--partition") for x in d)


@pytest.mark.parametrize("site,queue", [("frontier", "debug"), ("perlmutter", "debug"), ("polaris", "debug-scaling"),
                                        ("aurora", "debug"), ("aurora", "debug-scaling")])
def test_chain_is_refused_where_the_queue_takes_one_job(site, queue, data, tmp_path, capsys):  # noqa: F811
    nodes = 2
    code, out, err = launch(capsys, "--site", site, "--nodes", nodes, "--queue", queue, "--walltime", "00:30",
                            "--submit", "--chain", 2, "--", "evolve", "--data", data, "--out", tmp_path / "run",
                            "--evaluations", 10)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--chain 2: queue {queue} takes one job per user at a time" in err and f"{site}.toml" in err
    assert not (tmp_path / "run").exists() and not out  # nothing written, nothing submitted


def _staged(site: str, stage: str, tmp_path: Path, **given) -> str:
    profile = load_site(site)
    opts = {**{k: v for k, v in profile.items() if k in ("scheduler", "gpus_per_node", "cpus_per_node", "queue",
                                                          "walltime", "constraint")},
            "nodes": 2, "gpus_per_node": 4, "cpus_per_node": 40, "program": "galapagos", "stage": stage, **given}
    opts = apply_site(profile, opts, given)
    cmd = ("evolve", "--data", "/data/d.h5", "--out", str(tmp_path / "run"), "--evaluations", "4")
    req = build_request(opts, cmd, tmp_path / "run", site=profile, script=tmp_path / "run" / "job" / "s.sh")
    text, _ = render(replace(req, stage_env=tmp_path / "env.tar", stage_data="/data/d.h5"))
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    return text


def test_staging_to_node_local_storage_asks_for_it(tmp_path):
    """Frontier's NVMe exists only for jobs with -C nvme (OLCF); --stage /mnt/bb/$USER adds it, joined to any other
    constraint; staging to /tmp needs nothing. LSF's -alloc_flags NVME (Summit's rule, on an LSF profile that names
    it) joins the other allocation flags."""
    d = directives(_staged("frontier", "/mnt/bb/$USER", tmp_path), "#SBATCH")
    assert "--constraint=nvme" in d
    d = directives(_staged("frontier", "/mnt/bb/$USER/x", tmp_path, constraint="hbm"), "#SBATCH")
    assert [x for x in d if x.startswith("--constraint")] == ["--constraint=hbm&nvme"]
    assert not any("nvme" in x for x in directives(_staged("frontier", "/tmp", tmp_path), "#SBATCH"))
    lsf = tmp_path / "lsf-nvme.toml"
    lsf.write_text(find_site("generic-lsf").read_text() + '\n[storage]\nlocal = "/mnt/bb/$USER"\n'
                   'directive = "-alloc_flags NVME"\n')
    text = _staged(str(lsf), "/mnt/bb/$USER", tmp_path, constraint="smt2")
    assert "-alloc_flags 'smt2 NVME'" in directives(text, "#BSUB")
    assert "-alloc_flags NVME" in directives(_staged(str(lsf), "/mnt/bb/$USER", tmp_path), "#BSUB")


def test_a_retired_machine_is_refused_with_its_date_and_lsf_stays(data, tmp_path, capsys):  # noqa: F811
    code, out, err = launch(capsys, "--site", "summit", "--nodes", 2, "--", "evolve", "--data", data, "--out",
                            tmp_path / "run", "--evaluations", 10)
    assert code == 2 and err.count("\n") == 1 and "summit was retired on 2024-11-15" in err and "generic-lsf" in err
    code, out, err = launch(capsys, "--site", "generic-lsf", "--nodes", 2, "--gpus-per-node", 6, "--cpus-per-node",
                            42, "--", "evolve", "--data", data, "--out", tmp_path / "lsf", "--evaluations", 10)
    assert code == 0 and launch_line(written(out)[0].read_text()).startswith("jsrun --erf_input")


def _head(text: str, until: str) -> str:
    """The script's lines up to and including the first that starts with `until`."""
    lines = text.splitlines()
    return "\n".join(lines[:next(i for i, x in enumerate(lines) if x.startswith(until)) + 1]) + "\n"


def test_the_pals_check_refuses_a_hydra_mpiexec(data, tmp_path, capsys):  # noqa: F811
    """A PBS script checks that the mpiexec it finds is PALS's: the mpich wheel's Hydra mpiexec (this venv's, run for
    real) is refused with one line and exit 2; an mpiexec that is neither Hydra, Open MPI nor Intel MPI passes."""
    code, out, err = launch(capsys, "--site", "polaris", "--nodes", 2, "--queue", "debug", "--walltime", "00:30",
                            "--", "evolve", "--data", data, "--out", tmp_path / "run", "--evaluations", 10)
    assert code == 0, err
    text = written(out)[0].read_text()
    check = "set -eo pipefail\n" + text[text.index("launcher_version="):text.index("\nfi\n") + 4] + "echo passed\n"
    hydra = Path(sys.executable).parent / "mpiexec"
    assert hydra.exists()
    env = {**os.environ, "PATH": f"{hydra.parent}:/usr/bin:/bin"}
    proc = subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "passed" not in proc.stdout, proc
    assert proc.stderr.count("\n") == 1 and f"mpiexec ({hydra}) is not HPE Cray PALS's" in proc.stderr
    pals = tmp_path / "pals" / "mpiexec"  # stands in for /opt/cray/pals/.../mpiexec, which this machine has not
    pals.parent.mkdir()
    pals.write_text("#!/bin/sh\necho 'mpiexec version 1.2.12'\n")
    pals.chmod(0o755)
    env["PATH"] = f"{pals.parent}:/usr/bin:/bin"
    proc = subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == "passed\n", proc


def _preflight(text: str) -> str:
    """The script's doctor line (and the site export before it), as a script of its own."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if " doctor --before-launch " in line)
    return "set -eo pipefail\n" + "\n".join(lines[at - 1:at + 1]) + "\necho passed\n"


def test_the_script_runs_doctor_before_the_ranks_and_stops_on_a_pmi_mismatch(data, tmp_path, capsys):  # noqa: F811
    """Every script runs `galapagos doctor --before-launch` after the site setup and before the launch line, with the
    launcher, PMI and profile it was written for. Run for real with this venv's pip MPICH: under Frontier's srun
    --mpi=cray_shasta it stops with exit 2 and one line naming the fix; a local job (the wheel's own mpiexec) passes."""
    code, out, err = launch(capsys, "--site", "frontier", "--nodes", 2, "--walltime", "01:00", "--", "evolve",
                            "--data", data, "--out", tmp_path / "run", "--evaluations", 10)
    assert code == 0, err
    text = written(out)[0].read_text()
    assert text.index("set -u ") < text.index("doctor --before-launch") < text.index(supervise_line(text))
    line = next(line for line in text.splitlines() if " doctor --before-launch " in line)
    assert "--launcher srun" in line and "--pmi cray_shasta" in line and "frontier.toml" in line
    proc = subprocess.run(["bash", "-c", _preflight(text)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2 and "passed" not in proc.stdout, proc
    assert proc.stderr.strip().count("\n") == 0 and "PMI mismatch" in proc.stderr and "--srun-mpi pmi2" in proc.stderr
    code, out, err = launch(capsys, "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0, "--workers-per-node",
                            1, "--", "evolve", "--data", data, "--out", tmp_path / "run2", "--evaluations", 2)
    assert code == 0, err
    text = written(out)[0].read_text()
    assert "--launcher mpiexec" in text and "GALAPAGOS_SITE" not in text
    proc = subprocess.run(["bash", "-c", _preflight(text)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout == "passed\n", proc


def test_nounset_starts_after_a_setup_that_reads_unset_variables(data, tmp_path, capsys):  # noqa: F811
    """conda's activation reads unset variables (conda issues 3200, 8186, 9966): the site setup runs before `set -u`,
    and the rest of the script runs under it."""
    activate = tmp_path / "activate"
    activate.write_text('if [ -n "$GALAPAGOS_TEST_NEVER_SET" ]; then echo "$GALAPAGOS_TEST_NEVER_SET"; fi\n'
                        'export ACTIVATED=1\n')
    code, out, err = launch(capsys, "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0, "--workers-per-node",
                            1, "--setup", f"source {activate}", "--", "evolve", "--data", data, "--out",
                            tmp_path / "run", "--evaluations", 2)
    assert code == 0, err
    head = _head(written(out)[0].read_text(), "set -u")
    env = {k: v for k, v in os.environ.items() if k != "GALAPAGOS_TEST_NEVER_SET"}
    proc = subprocess.run(["bash", "-c", head + 'echo "reached $ACTIVATED"\n'], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("reached 1"), proc
    proc = subprocess.run(["bash", "-c", head + 'echo "$GALAPAGOS_TEST_NEVER_SET"\n'], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "unbound variable" in proc.stderr  # strict from there on


# -- galapagos setup --------------------------------------------------------------------------------------------------
def setup(capsys, *args) -> tuple[int, list[str], str]:
    code = main(["setup", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.mark.parametrize("name", [n for n in LIVE if n != "workstation"])
def test_setup_prints_each_centres_commands_in_order(name, tmp_path, capsys):
    """A centre's environment needs its modules, so `setup` prints the commands for its login node: the modules in
    the profile's order, a venv (over the module's python where mpi4py comes with it), mpi4py by the route, torch
    for the site's GPUs, galapagos-nas; nothing is created here."""
    profile, target = load_site(name), tmp_path / "env"
    mpi = profile["mpi"]
    code, lines, err = setup(capsys, "--site", name, target)
    assert code == 0 and not target.exists(), err
    assert lines[0].startswith(f"# the Python environment for {name}") and f"on a login node of {name}" in lines[0]
    body = [x for x in lines if not x.startswith("#")]
    assert body[:len(mpi.get("prepare", []))] == mpi.get("prepare", [])
    venv = next(i for i, x in enumerate(body) if " -m venv " in x or x.startswith("conda create"))
    modules = [x for x in body[:venv] if x.startswith("module ")]
    assert modules == [*(f"module use {m}" for m in mpi.get("module_use", [])),
                       *(f"module unload {m[1:]}" if m[0] == "-" else f"module load {m}"
                         for m in mpi.get("modules", []))]
    assert ("--system-site-packages" in body[venv]) == (mpi["python"] == "venv-system")
    assert body[venv + 1] == f"source {target}/bin/activate"
    rest = body[venv + 2:]
    if mpi["route"] == "build":
        assert rest[0] == mpi["install"] and "--no-binary=mpi4py" in rest[0] and "--no-cache-dir" in rest[0]
    else:
        assert not any("mpi4py" in x for x in rest)  # the module's own mpi4py, built against the site's MPI
    assert (f"{target}/bin/python -m pip install {mpi.get('torch')}" in rest) == ("torch" in mpi)
    assert rest[-1] == f"{target}/bin/python -m pip install galapagos-nas"
    assert f"galapagos doctor --site {name}" in lines[-2] and f"galapagos launch --site {name}" in lines[-1]


def test_setup_follows_the_documented_recipes(tmp_path, capsys):
    """OLCF's recipe (rocm and craype-accel-* unloaded, MPICC="cc -shared", no cached or binary mpi4py); NERSC's
    (--force-reinstall); ALCF's frameworks and conda modules with a venv over them; CSCS's uenv first."""
    _, lines, _ = setup(capsys, "--site", "frontier", tmp_path / "f")
    assert {"module unload rocm", "module unload craype-accel-amd-gfx90a"} <= set(lines)
    assert 'MPICC="cc -shared" pip install --no-cache-dir --no-binary=mpi4py mpi4py' in lines
    assert any("download.pytorch.org/whl/rocm" in x for x in lines)
    _, lines, _ = setup(capsys, "--site", "perlmutter", tmp_path / "p")
    assert 'MPICC="cc -shared" pip install --force-reinstall --no-cache-dir --no-binary=mpi4py mpi4py' in lines
    _, lines, _ = setup(capsys, "--site", "aurora", tmp_path / "a")
    assert "module load frameworks" in lines and f"python3 -m venv --system-site-packages {tmp_path}/a" in lines
    _, lines, _ = setup(capsys, "--site", "polaris", tmp_path / "po")
    assert lines[1:3] == ["module use /soft/modulefiles", "module load conda"]
    _, lines, _ = setup(capsys, "--site", "alps", tmp_path / "al")
    assert lines[1] == "uenv start prgenv-gnu/24.11:v1 --view=default"


def test_setup_refuses_what_it_cannot_do(tmp_path, capsys):
    code, _, err = setup(capsys, "--site", "summit", tmp_path / "s")
    assert code == 2 and "summit was retired on 2024-11-15" in err and err.count("\n") == 1
    bare = tmp_path / "bare.toml"
    bare.write_text('scheduler = "slurm"\n')
    code, _, err = setup(capsys, "--site", bare, tmp_path / "b")
    assert code == 2 and "no [mpi] route in the profile" in err
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("")
    code, _, err = setup(capsys, "--site", "workstation", taken)
    assert code == 2 and "exists and is not empty" in err


def test_setup_prints_the_workstation_commands_with_print(tmp_path, capsys):
    code, lines, _ = setup(capsys, "--site", "workstation", tmp_path / "w", "--print")
    assert code == 0 and not (tmp_path / "w").exists()
    assert lines[1:4] == [f"{sys.executable} -m venv {tmp_path}/w", f"{tmp_path}/w/bin/python -m pip install torch",
                          f"{tmp_path}/w/bin/python -m pip install 'galapagos-nas[mpich]'"]


def test_setup_makes_a_workstation_environment(tmp_path, capsys):
    """The wheel route really runs: a venv, then galapagos-nas from a wheel of this checkout (offline: --no-index,
    --no-deps; torch skipped), whose `galapagos` entry point starts from the new environment."""
    checkout, wheels = tmp_path / "checkout", tmp_path / "wheels"  # a copy: pip builds in the source tree
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, checkout / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(wheels), str(checkout)], check=True, timeout=300, capture_output=True)
    target = tmp_path / "env"
    code, lines, err = setup(capsys, "--site", "workstation", target, "--torch", "", "--pip-args",
                             f"--no-index --no-deps --find-links {wheels}")
    assert code == 0, err
    assert lines[-3] == f"environment ready: {target}"
    proc = subprocess.run([str(target / "bin" / "python"), "-c", "import galapagos; print(galapagos.__file__)"],
                          capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path)
    assert Path(proc.stdout.strip()).is_relative_to(target)
    assert (target / "bin" / "galapagos").exists()


# -- the per-site pages ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CENTRES)
def test_every_centre_has_its_first_job_page(name):
    """docs/sites/NAME.md: set-up and first launch for the profile by its name; every --site it names is this one,
    every queue it names is one of the profile's, and it cites the route's page."""
    page = REPO / "docs" / "sites" / f"{name}.md"
    assert page.exists(), page
    text, profile = page.read_text(), load_site(name)
    assert f"galapagos setup --site {name} " in text and f"galapagos launch --site {name} " in text
    assert set(re.findall(r"--site ([\w.-]+)", text)) == {name}
    assert set(re.findall(r"--queue ([\w.-]+)", text)) <= set(profile.get("queues", {}))
    assert profile["mpi"]["doc"] in text and "galapagos doctor" in text
