"""`galapagos launch`: every scheduler's job script, checked by the properties that matter, and a local job run
for real (stopped by its wall-time watchdog, then resumed to completion by the follow-up job)."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples import shapes
from galapagos.cli import main
from launch.scripts import SCHEDULERS, SCHEDULERS_ORDER, load_site
from tests.mpirun import REPO

SITES = sorted((REPO / "examples" / "sites").glob("*.toml"))
TINY = ["--set", "train.epochs=1", "--set", "space.max_layers=3", "--set", "space.channels=[4, 8]",
        "--set", "space.units=[16, 32]", "--set", "evolution.population_size=4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=300, size=12, seed=1)
    return path


def launch(capsys, *args) -> tuple[int, str, str]:
    code = main(["launch", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def written(out: str) -> list[Path]:
    return [Path(line.split(": ", 1)[1]) for line in out.splitlines() if line.startswith("script: ")]


def directives(text: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in text.splitlines() if line.startswith(prefix + " ")]


def launch_line(text: str) -> str:
    """The line that starts the MPI job (run in the background so the trap can pass signals on)."""
    lines = [line for line in text.splitlines() if line.endswith(" &") and '"${command[@]}"' in line]
    assert len(lines) == 1, text
    return lines[0][:-2]


def command_array(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("command=("))
    return shlex.split(line[len("command=("):-1])


def ranks_in(line: str, n_flag: str, per_flag: str) -> list[tuple[int, int]]:
    """(ranks, ranks per node) of each MPMD part of an aprun/PALS line."""
    return [(int(a), int(b)) for a, b in re.findall(rf"{n_flag} (\d+) {per_flag} (\d+)", line)]


GEOMETRIES = [(2, 4), (4608, 6)]


@pytest.mark.parametrize("scheduler", [s for s in SCHEDULERS_ORDER if s != "local"])
@pytest.mark.parametrize("nodes,gpus", GEOMETRIES)
def test_every_scheduler_renders_the_layout(scheduler, nodes, gpus, data, tmp_path, capsys):
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--scheduler", scheduler, "--nodes", nodes, "--gpus-per-node", gpus,
                            "--cpus-per-node", 42, "--walltime", "02:00", "--stop-before", 300, "--account", "ABC123",
                            "--queue", "batch", "--job-name", "shapes-big", "--env", "OMP_NUM_THREADS=7",
                            "--env", "CACHE=/tmp/c-$USER", "--setup", "module load cuda\nsource /opt/venv/bin/activate",
                            "--", "galapagos", "evolve", "--data", data, "--out", out_dir, "--evaluations", 5000, *TINY)
    assert code == 0, err
    (script,) = written(out)
    assert script == out_dir / "job" / f"{scheduler}-1.sh" and os.access(script, os.X_OK)
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)  # valid shell
    sched = SCHEDULERS[scheduler]
    d = directives(text, sched.prefix)
    ranks, workers = nodes * gpus + 1, nodes * gpus
    line = launch_line(text)

    # header, strict mode, setup and environment before the launch
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "# galapagos launch --scheduler " + scheduler in text
    order = [lines.index(x) for x in ("set -euo pipefail", "module load cuda", "source /opt/venv/bin/activate",
                                      'export OMP_NUM_THREADS="7"', 'export CACHE="/tmp/c-$USER"')]
    assert order == sorted(order) and order[-1] < lines.index(line + " &")
    assert f"{workers} worker(s) + 1 master = {ranks} MPI ranks" in text

    # the command: this installation's galapagos, absolute paths, the resolved config pinned beside the script
    cmd = command_array(text)
    assert cmd[0].endswith("galapagos") or cmd[1:3] == ["-m", "galapagos.cli"]
    sub = cmd[cmd.index("evolve"):]
    assert sub[sub.index("--data") + 1] == str(data) and sub[sub.index("--out") + 1] == str(out_dir)
    pinned = Path(sub[sub.index("--config") + 1])
    assert pinned == out_dir / "job" / "config.toml" and "epochs = 1" in pinned.read_text()
    assert "evaluations = 5000" in pinned.read_text()

    if scheduler == "slurm":
        assert {f"--nodes={nodes}", f"--ntasks={ranks}", "--overcommit", "--exclusive", f"--gpus-per-node={gpus}",
                "--time=02:00:00", "--signal=B:USR1@300", "--account=ABC123", "--partition=batch",
                "--job-name=shapes-big"} <= set(d)
        assert f"--ntasks={ranks}" in line and "--distribution=arbitrary" in line and "--gpu-bind=none" in line
        assert "--cpu-bind=none" in line and "--gpus-per-task" not in text
        # the host list: the first node once more (rank 0) then gpus per node
        assert f"awk -v per={gpus} 'NR == 1 {{print}} {{for (i = 0; i < per; i++) print}}'" in text
        assert "SLURM_HOSTFILE" in text
    elif scheduler == "lsf":
        assert {f"-nnodes {nodes}", "-W 02:00", "-wa USR1", "-wt 5", "-P ABC123", "-q batch",
                "-J shapes-big"} <= set(d)
        erf = (script.parent / f"{scheduler}-1.erf").read_text().splitlines()
        assert f'--erf_input "$job_dir/{scheduler}-1.erf"' in line and line.startswith("jsrun ")
        specs = [re.fullmatch(r"rank: (\d+) : \{ host: (\d+); cpu: \{0-41\}(?:; gpu: \{(\d+)\})? \}", x)
                 for x in erf if x.startswith("rank:")]
        assert all(specs) and [int(m.group(1)) for m in specs] == list(range(ranks))
        assert specs[0].group(2) == "1" and specs[0].group(3) is None  # the master: first host, no GPU
        per_host: dict[int, list[int]] = {}
        for m in specs[1:]:
            per_host.setdefault(int(m.group(2)), []).append(int(m.group(3)))
        assert len(per_host) == nodes and all(sorted(g) == list(range(gpus)) for g in per_host.values())
    elif scheduler in ("alps", "pbs"):
        assert {"-l walltime=02:00:00", "-A ABC123", "-q batch", "-N shapes-big", "-j oe"} <= set(d)
        assert (f"-l nodes={nodes}" if scheduler == "alps" else f"-l select={nodes}") in d
        parts = ranks_in(line, "-n", "-N" if scheduler == "alps" else "--ppn")
        assert parts == [(gpus + 1, gpus + 1), (workers - gpus, gpus)]  # rank 0 + first node's workers first
        assert sum(n for n, _ in parts) == ranks
        assert ("-cc none" if scheduler == "alps" else "--cpu-bind none") in line
        assert f"sleep {7200 - 300}" in text and "kill -USR1 $$" in text  # the watchdog ahead of the wall time
    elif scheduler == "flux":
        assert {f"-N {nodes}", "--exclusive", "-t 120m", "--bank=ABC123", "--queue=batch",
                "--job-name=shapes-big"} <= set(d)
        assert f"flux run -N {nodes} -n {ranks}" in line and "gpu-affinity=off" in line
        assert f"sleep {7200 - 300}" in text
    assert "trap request_stop USR1 TERM" in text


def test_walltime_and_lead_conversions(data, tmp_path, capsys):
    """Days, odd minutes and the default lead (a tenth of the wall time, 60 to 600 s) in each scheduler's units."""
    cases = {"slurm": ("--time=1-06:30:00", "--signal=B:USR1@600"), "lsf": ("-W 30:30", "-wt 10"),
             "pbs": ("-l walltime=30:30:00", None), "flux": ("-t 1830m", None)}
    for scheduler, (wall, lead) in cases.items():
        code, out, err = launch(capsys, "--scheduler", scheduler, "--nodes", 1, "--gpus-per-node", 4,
                                "--cpus-per-node", 8, "--walltime", "1-06:30", "--", "evolve", "--data", data,
                                "--out", tmp_path / scheduler, "--evaluations", 10)
        assert code == 0, err
        d = directives(written(out)[0].read_text(), SCHEDULERS[scheduler].prefix)
        assert wall in d and (lead is None or lead in d), d
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 1, "--gpus-per-node", 4, "--walltime", "00:20",
                            "--", "evolve", "--data", data, "--out", tmp_path / "short", "--evaluations", 10)
    assert "--signal=B:USR1@120" in directives(written(out)[0].read_text(), "#SBATCH")


def test_cpu_only_nodes(data, tmp_path, capsys):
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 3, "--gpus-per-node", 0, "--cpus-per-node", 32,
                            "--workers-per-node", 8, "--", "evolve", "--data", data, "--out", tmp_path / "r",
                            "--evaluations", 10)
    assert code == 0, err
    text = written(out)[0].read_text()
    assert "--ntasks=25" in directives(text, "#SBATCH") and "gpus" not in launch_line(text)
    assert "no GPUs, 8 worker(s) per node: 24 worker(s) + 1 master = 25 MPI ranks" in text
    code, out, err = launch(capsys, "--scheduler", "pbs", "--nodes", 2, "--gpus-per-node", 0, "--cpus-per-node", 16,
                            "--", "evolve", "--data", data, "--out", tmp_path / "r2", "--evaluations", 10)
    assert code == 0, err  # one worker per core by default
    assert ranks_in(launch_line(written(out)[0].read_text()), "-n", "--ppn") == [(17, 17), (16, 16)]


def test_slurm_with_mpiexec_inside_the_allocation(data, tmp_path, capsys):
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--launcher",
                            "mpiexec", "--", "evolve", "--data", data, "--out", tmp_path / "r", "--evaluations", 10)
    assert code == 0, err
    line = launch_line(written(out)[0].read_text())
    assert line.split()[0].endswith("mpiexec") and '-n 9 -f "$SLURM_HOSTFILE"' in line and "srun" not in line
    code, out, err = launch(capsys, "--scheduler", "pbs", "--nodes", 2, "--gpus-per-node", 4, "--launcher",
                            "mpiexec", "--", "evolve", "--data", data, "--out", tmp_path / "r2", "--evaluations", 10)
    assert code == 2 and "inside a Slurm allocation" in err


def test_bad_inputs_are_clear_errors_and_write_nothing(data, tmp_path, capsys):
    out_dir = tmp_path / "run"
    ok = ["--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10]
    cases = [
        (["--scheduler", "slurm", "--nodes", 0, "--gpus-per-node", 4, *ok], "--nodes 0: a job needs at least one"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 0, "--cpus-per-node", 4, "--workers-per-node", 8,
          *ok], "8 workers per node need at least 8 cores"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 0, *ok], "CPU-only nodes need --workers-per-node"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--workers-per-node", 2, *ok],
         "one worker per GPU"),
        (["--scheduler", "sge", "--nodes", 2, "--gpus-per-node", 4, *ok], "--scheduler 'sge': unknown"),
        (["--nodes", 2, "--gpus-per-node", 4, *ok], "--scheduler is required"),
        (["--scheduler", "local", "--nodes", 2, "--gpus-per-node", 1, *ok], "this machine only"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--walltime", "00:10", "--stop-before", 600,
          *ok], "--stop-before 600"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--walltime", "1:75", *ok], "below 60"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--walltime", "soon", *ok], "expected HH:MM"),
        (["--scheduler", "lsf", "--nodes", 2, "--gpus-per-node", 6, *ok], "--cpus-per-node is needed"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--env", "NOEQUALS", *ok], "NAME=VALUE"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--chain", 2, *ok], "--chain needs --submit"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--", "evolve", "--data", data, "--out",
          tmp_path / "no" / "such" / "run", "--evaluations", 10], "parent directory"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--", "predict", "--model", "m", "--data", data],
         "must be a Galapagos job (evolve, ensemble, design)"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--", "python", "train.py"],
         "must be a Galapagos job"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4], "no command"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--", "evolve", "--out", out_dir],
         "the command after --: "),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--", "evolve", "--data", tmp_path / "nope.h5",
          "--out", out_dir, "--evaluations", 10], "nope.h5: no such file"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, *ok, "--set", "train.epochz=1"], "train.epochz"),
        (["--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--site", tmp_path / "none.toml", *ok],
         "no such file"),
        (["--resume", tmp_path], "no job/launch.toml"),
    ]
    for args, words in cases:
        code, out, err = launch(capsys, *args)
        assert code == 2, (args, out, err)
        assert err.startswith("galapagos launch: error: ") and words in err, (args, err)
        assert not out_dir.exists(), args


def test_site_profiles(data, tmp_path, capsys):
    """Each bundled profile renders with only --nodes (and a command), and its machine limits are enforced."""
    assert {p.stem for p in SITES} >= {"summit", "perlmutter", "polaris", "frontier", "workstation"}
    for site in SITES:
        profile = load_site(site)
        nodes = profile["machine"]["max_nodes"]
        code, out, err = launch(capsys, "--site", site, "--nodes", nodes, "--", "evolve", "--data", data,
                                "--out", tmp_path / site.stem, "--evaluations", 10)
        assert code == 0, (site, err)
        text = written(out)[0].read_text()
        gpus = profile["gpus_per_node"]
        assert f"{nodes * gpus} worker(s) + 1 master = {nodes * gpus + 1} MPI ranks" in text
        assert all(line in text for line in profile.get("setup", "").strip().splitlines())
        code, out, err = launch(capsys, "--site", site, "--nodes", nodes + 1, "--", "evolve", "--data", data,
                                "--out", tmp_path / (site.stem + "2"), "--evaluations", 10)
        assert code == 2 and f"has only {nodes}" in err
    bad = tmp_path / "bad.toml"
    bad.write_text('schedular = "slurm"\n')
    code, _, err = launch(capsys, "--site", bad, "--nodes", 1, "--", "evolve", "--data", data, "--out",
                          tmp_path / "b", "--evaluations", 10)
    assert code == 2 and "unknown key 'schedular'" in err


def test_resume_writes_the_follow_up_with_its_dependency(data, tmp_path, capsys):
    out_dir = tmp_path / "run"
    for scheduler, dependency in (("slurm", "#SBATCH --dependency=afterany:4242"),
                                  ("lsf", "#BSUB -w 'ended(4242)'"), ("pbs", "#PBS -W depend=afterany:4242"),
                                  ("flux", "# flux: --dependency=afterany:4242")):
        code, out, err = launch(capsys, "--scheduler", scheduler, "--nodes", 2, "--gpus-per-node", 4,
                                "--cpus-per-node", 16, "--walltime", "01:00", "--", "evolve", "--data", data, "--out",
                                out_dir, "--evaluations", 10, "--config", REPO / "examples" / "demo.toml", *TINY)
        assert code == 0, err
        first = written(out)[0]
        code, out, err = launch(capsys, "--resume", out_dir, "--after", 4242, "--walltime", "00:30")
        assert code == 0, err
        follow = written(out)[0]
        assert follow.name == f"{scheduler}-2.sh" and first.name == f"{scheduler}-1.sh"
        text = follow.read_text()
        assert dependency in text
        cmd = command_array(text)
        assert "--resume" in cmd and "--config" not in cmd and cmd[cmd.index("--out") + 1] == str(out_dir)
        before = command_array(first.read_text())
        at = before.index("--config")
        assert cmd == before[:at] + before[at + 2:] + ["--resume"]
        assert launch_line(text) == launch_line(first.read_text()).replace(f"{scheduler}-1", f"{scheduler}-2")
        for f in out_dir.joinpath("job").glob("*"):
            f.unlink()


def _watch(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"job script still running after {timeout:.0f} s:\n{out[-4000:]}")
    return out


def journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def _start(script: Path, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    return subprocess.Popen(["bash", str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.mark.mpi
def test_local_job_stops_cleanly_on_sigusr1_and_the_follow_up_finishes(data, tmp_path, capsys):
    """A real `local` job gets SIGUSR1 in the middle of its run, sent to its whole process group as a scheduler
    does: the run stops cleanly, and the job `launch --resume` writes completes it, every evaluation once."""
    out_dir, budget = tmp_path / "run", 60
    code, out, err = launch(capsys, "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0, "--workers-per-node",
                            2, "--walltime", "10", "--", "galapagos", "evolve", "--data", data, "--out", out_dir,
                            "--evaluations", budget, *TINY)
    assert code == 0, err
    proc = _start(written(out)[0], tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (out_dir / "results.jsonl").exists() and len((out_dir / "results.jsonl").read_bytes().splitlines()) >= 5:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGUSR1)
    log = _watch(proc, 120)
    assert proc.returncode == 0, log
    assert "galapagos job: stop requested" in log and "stop requested (SIGUSR1)" in log, log
    assert "continue with --resume" in log
    summary = json.loads((out_dir / "summary.json").read_text())
    before = journal(out_dir)
    assert summary["stopped_by"] == "SIGUSR1" and 5 <= summary["evaluations"] == len(before) < budget

    code, out, err = launch(capsys, "--resume", out_dir)
    assert code == 0, err
    follow = written(out)[0]
    assert "--resume" in command_array(follow.read_text())
    proc = _start(follow, tmp_path)
    log = _watch(proc, 180)
    assert proc.returncode == 0, log
    assert f"{len(before)} evaluation(s) already done" in log
    after = journal(out_dir)
    assert after[:len(before)] == before  # nothing lost or rewritten
    assert len(after) == budget and len({r["id"] for r in after}) == budget  # nothing repeated
    assert len({r["key"] for r in after}) == budget
    assert "stopped_by" not in json.loads((out_dir / "summary.json").read_text())
    settings = (out_dir / "job" / "launch.toml").read_text()
    assert "local-1.sh" in settings and "local-2.sh" in settings


def test_watchdog_stops_a_job_ahead_of_its_wall_time(data, tmp_path, capsys):
    """The script's own watchdog (schedulers without a warning signal) fires at wall time minus --stop-before;
    here it fires while the site setup still runs, so the run is not even started."""
    code, out, err = launch(capsys, "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0, "--workers-per-node",
                            1, "--walltime", "1", "--stop-before", 59, "--setup", "sleep 3", "--", "evolve", "--data",
                            data, "--out", tmp_path / "run", "--evaluations", 2)
    assert code == 0, err
    script = written(out)[0]
    assert "sleep 1 & sleep_pid=$!" in script.read_text()
    proc = _start(script, tmp_path)
    log = _watch(proc, 30)
    assert proc.returncode == 0 and "stopped before the run started" in log, log
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_local_submit_runs_in_the_background_and_chains(data, tmp_path, capsys):
    """--submit on a workstation starts the script detached (the job id is its process id); a chained follow-up
    waits for that process. Tiny budget: the follow-up finds the run complete and ends at once."""
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0, "--workers-per-node",
                            1, "--submit", "--chain", 1, "--", "evolve", "--data", data, "--out", out_dir,
                            "--evaluations", 2, *TINY, "--set", "run.task='tests.faulty_tasks:quick'")
    assert code == 0, err
    first, follow = written(out)
    ids = re.findall(r"submitted: local job (\d+)", out)
    assert len(ids) == 2
    assert f"while kill -0 {ids[0]}" in follow.read_text()
    deadline = time.time() + 120
    while time.time() < deadline and any(_alive(int(i)) for i in ids):
        time.sleep(0.5)
    assert not any(_alive(int(i)) for i in ids), "local jobs still running"
    assert len(journal(out_dir)) == 2
    logs = first.with_suffix(".out").read_text() + follow.with_suffix(".out").read_text()
    assert logs.count("evaluations: 2") == 2, logs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a finished child of this process that nobody reaped yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_lsf_wall_time_is_whole_minutes_rounded_up():
    from launch.scripts import parse_walltime
    from launch.scripts.schedulers import _lsf_time

    assert _lsf_time(parse_walltime("00:59:30")) == "01:00" and _lsf_time(parse_walltime("90")) == "01:30"
    assert parse_walltime("2-00:00") == 172800 and parse_walltime("00:01:05") == 65


def test_python_entry_is_the_launch_cli():
    """Run as `python -m galapagos.cli launch --help`: the subcommand is wired into the shared CLI."""
    proc = subprocess.run([sys.executable, "-m", "galapagos.cli", "launch", "--help"], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0 and "--scheduler" in proc.stdout and "--resume" in proc.stdout
