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

from galapagos.cli import main
from galapagos.examples import shapes
from galapagos.launch.scripts import SCHEDULERS, SCHEDULERS_ORDER
from tests.mpirun import REPO

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


def ranks_text(text: str) -> str:
    """The ranks file beside a script (launch/scripts/body.py), which the script's `galapagos supervise` line runs
    to start the ranks on the nodes that answer."""
    job_dir = shlex.split(next(x for x in text.splitlines() if x.startswith("job_dir=")).partition("=")[2])[0]
    name = re.search(r'--ranks "\$job_dir/([^"]+)"', text).group(1)
    return (Path(job_dir) / name).read_text()


def launch_line(text: str) -> str:
    """The line that starts the MPI job on the whole allocation: the ranks file's `exec` line, its node count
    ($nodes, the nodes that answer) worked out for every node of the job."""
    nodes = int(re.search(r"^# (\d+) node\(s\), ", text, re.MULTILINE).group(1))
    lines = [x[len("exec "):] for x in ranks_text(text).splitlines() if x.startswith("exec ")
             and '"${command[@]}"' in x]
    assert len(lines) == 1, ranks_text(text)
    line = re.sub(r"\$\(\((.+?)\)\)", lambda m: str(eval(m.group(1).replace("nodes", str(nodes)))), lines[0])
    return re.sub(r'\$nodes\b|"\$nodes"', str(nodes), line)


def supervise_line(text: str) -> str:
    """The script's run line: galapagos supervise, in the background so that the trap can pass signals on."""
    lines = [x for x in text.splitlines() if x.endswith(" &") and " supervise " in x]
    assert len(lines) == 1, text
    return lines[0][:-2]


def command_array(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("command=("))
    return shlex.split(line[len("command=("):-1])


def ranks_in(line: str, n_flag: str, per_flag: str) -> list[tuple[int, int]]:
    """(ranks, ranks per node) of each MPMD part of an aprun/PALS line."""
    return [(int(a), int(b)) for a, b in re.findall(rf"{n_flag} (\d+) {per_flag} (\d+)", line)]


def srun_rules(line: str, ranks: int) -> None:
    """srun(1): --nodes "cannot be used in with arbitrary distribution" (Slurm 23.11+ exits: "--nodes is
    incompatible with --distribution=arbitrary"); the host list in SLURM_HOSTFILE gives the nodes."""
    args = shlex.split(line)
    assert args[0] == "srun" and f"--ntasks={ranks}" in args and "--distribution=arbitrary" in args
    assert not any(a == "-N" or a.startswith("--nodes") for a in args), line


def check_erf(text: str, nodes: int, per_node: int, gpus: int, cpus: int, smt: int = 4) -> None:
    """jsrun's resource file (IBM ERF format, OLCF's ERF-CPU-Indexing tutorial): physical hardware-thread numbers,
    4 per POWER9 core whatever the SMT level, the core after each socket's usable ones kept for the system. Rank 0
    on host 1 without a GPU; on every host one rank per GPU; each worker only threads of its own cores, all on its
    GPU's socket (GPUs 0..G/2-1 on socket 0); no two ranks of a host share a core (when one is spare)."""
    lines = text.splitlines()
    assert "cpu_index_using: physical" in lines and "cpu_index_using: logical" not in lines
    stride = cpus // 2 + 1  # cores per socket, the system's one included
    specs = [re.fullmatch(r"rank: (\d+) : \{ host: (\d+); cpu: ((?:\{\d+(?:-\d+)?\},?)+)(?:; gpu: \{(\d+)\})? \}", x)
             for x in lines if x.startswith("rank:")]
    assert all(specs) and [int(m.group(1)) for m in specs] == list(range(nodes * per_node + 1))
    hosts: dict[int, list[tuple[int, set[int], int | None]]] = {}
    for m in specs:
        threads = set()
        for a, b in re.findall(r"\{(\d+)(?:-(\d+))?\}", m.group(3)):
            threads |= set(range(int(a), int(b or a) + 1))
        cores = {t // 4 for t in threads}
        assert threads == {4 * c + t for c in cores for t in range(smt)}, m.group(0)  # SMT-aware
        assert all(c % stride < stride - 1 for c in cores), m.group(0)  # never the system's core
        gpu = None if m.group(4) is None else int(m.group(4))
        hosts.setdefault(int(m.group(2)), []).append((int(m.group(1)), cores, gpu))
    assert sorted(hosts) == list(range(1, nodes + 1))
    master = hosts[1][0]
    assert master[0] == 0 and master[2] is None  # the master: first host, no GPU
    for host, ranks in hosts.items():
        workers = [r for r in ranks if r[0] != 0]
        assert len(workers) == per_node
        if gpus:
            assert sorted(g for _, _, g in workers) == list(range(gpus))
        for i, (_, cores, gpu) in enumerate(workers):
            socket = (gpu if gpus else i) * 2 // per_node
            assert {c // stride for c in cores} == {socket}, (host, gpu, cores)  # the GPU's socket
        if per_node // 2 < cpus // 2:  # a core to spare on socket 0: nothing shared on any host
            every = [c for _, cores, _ in ranks for c in cores]
            assert len(every) == len(set(every)), host


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
    strict = next(i for i, x in enumerate(lines) if x.startswith("set -eo pipefail"))
    nounset = next(i for i, x in enumerate(lines) if x.startswith("set -u "))
    order = [strict, *(lines.index(x) for x in ("module load cuda", "source /opt/venv/bin/activate")), nounset,
             *(lines.index(x) for x in ('export OMP_NUM_THREADS="7"', 'export CACHE="/tmp/c-$USER"'))]
    assert order == sorted(order) and order[-1] < lines.index(supervise_line(text) + " &")  # nounset after the setup
    assert not any(x.startswith(("set -u", "set -eu")) for x in lines[:nounset])
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
                "--job-name=shapes-big"} <= set(d)  # #SBATCH --nodes stays: it sizes the allocation
        srun_rules(line, ranks)
        assert "--gpu-bind=none" in line and "--cpu-bind=none" in line and "--gpus-per-task" not in text
        assert "--mpi=" not in line and not any(x.startswith("--qos") for x in d)
        # the host list: the first node once more (rank 0) then gpus per node
        assert f"awk -v per={gpus} 'NR == 1 {{print}} {{for (i = 0; i < per; i++) print}}'" in ranks_text(text)
        assert "SLURM_HOSTFILE" in ranks_text(text) and "--no-kill" in d  # a dead node leaves the allocation
    elif scheduler == "lsf":
        assert {f"-nnodes {nodes}", "-W 02:00", "-wa USR1", "-wt 5", "-P ABC123", "-q batch",
                "-J shapes-big"} <= set(d)
        assert f'--erf_input "$job_dir/{scheduler}-1.erf"' in line and line.startswith("jsrun ")
        assert '--smpiargs="-disable_gpu_hooks"' in line  # the trainer is a CUDA process that is no MPI process
        check_erf((script.parent / f"{scheduler}-1.erf").read_text(), nodes, gpus, gpus, 42)
    elif scheduler in ("alps", "pbs"):
        assert {"-l walltime=02:00:00", "-A ABC123", "-q batch", "-N shapes-big", "-j oe"} <= set(d)
        assert (f"-l nodes={nodes}" if scheduler == "alps" else f"-l select={nodes}") in d
        parts = ranks_in(line, "-n", "-N" if scheduler == "alps" else "--ppn")
        assert parts == [(gpus + 1, gpus + 1), (workers - gpus, gpus)]  # rank 0 + first node's workers first
        assert sum(n for n, _ in parts) == ranks
        assert ("-cc none" if scheduler == "alps" else "--cpu-bind none") in line
        if scheduler == "pbs":  # PALS: the nodes that answer as one host file (Hydra refuses it twice), no Hydra flags
            assert "--hosts" not in line and "-f " not in line and line.count('--hostfile "$node_file"') == 1
            assert "is not HPE Cray PALS's" in text
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


def test_scheduler_specific_options_are_refused_elsewhere(data, tmp_path, capsys):
    out_dir = tmp_path / "run"
    geometry = ["--nodes", 2, "--gpus-per-node", 4, "--cpus-per-node", 42]
    command = ["--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10]
    cases = [(["--scheduler", scheduler, "--qos", "regular"], "--qos regular: only Slurm has a quality of service")
             for scheduler in ("pbs", "lsf", "alps", "flux")]
    cases += [(["--scheduler", "slurm", "--filesystems", "home:eagle"], "--filesystems home:eagle: a PBS Pro"),
              (["--scheduler", "pbs", "--filesystems", "home eagle"], "expected names joined by ':'"),
              (["--scheduler", "pbs", "--srun-mpi", "pmi2"], "--srun-mpi pmi2: srun's MPI plugin"),
              (["--scheduler", "slurm", "--launcher", "mpiexec", "--srun-mpi", "pmi2"], "not with --launcher mpiexec"),
              (["--scheduler", "slurm", "--directive", "#SBATCH --mail-type=END"], "without the prefix"),
              (["--scheduler", "local", "--nodes", 1, "--directive", "-x"], "the local scheduler reads no directives")]
    for args, words in cases:
        code, out, err = launch(capsys, *geometry, *args, *command)
        assert code == 2 and words in err and err.count("\n") == 1, (args, err)
        assert not out_dir.exists()


def test_slurm_qos_srun_mpi_filesystems_and_directives_are_written(data, tmp_path, capsys):
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--qos", "regular",
                            "--srun-mpi", "pmi2", "--directive", "--reservation=abc", "--directive", "-S 0", "--",
                            "evolve", "--data", data, "--out", tmp_path / "s", "--evaluations", 10)
    assert code == 0, err
    text = written(out)[0].read_text()
    d, line = directives(text, "#SBATCH"), launch_line(text)
    assert {"--qos=regular", "--reservation=abc", "-S 0"} <= set(d) and "--nodes=2" in d
    srun_rules(line, 9)
    assert "--mpi=pmi2" in shlex.split(line) and "--kill-on-bad-exit=1" in shlex.split(line)
    assert "reads each PMI-1 request with one read() of 1024 bytes" in text  # the limit, where it applies
    # one node: no host list, so Slurm's process map is right (before 24.05 it puts every task of an arbitrary
    # distribution on a node of its own, and MPICH then exchanges network addresses over PMI)
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 1, "--gpus-per-node", 4, "--srun-mpi", "pmi2",
                            "--", "evolve", "--data", data, "--out", tmp_path / "one", "--evaluations", 10)
    assert code == 0, err
    text = written(out)[0].read_text()
    assert shlex.split(launch_line(text))[:5] == ["srun", "--ntasks=5", "--overcommit", "--kill-on-bad-exit=1",
                                                 "--mpi=pmi2"]
    assert "SLURM_HOSTFILE" not in text and "arbitrary" not in launch_line(text)
    code, out, err = launch(capsys, "--scheduler", "pbs", "--nodes", 2, "--gpus-per-node", 4, "--filesystems",
                            "home:eagle", "--directive", "-l place=scatter:group=tier1", "--", "evolve", "--data",
                            data, "--out", tmp_path / "p", "--evaluations", 10)
    assert code == 0, err
    d = directives(written(out)[0].read_text(), "#PBS")
    assert {"-l filesystems=home:eagle", "-l place=scatter:group=tier1"} <= set(d)


def test_directives_and_options_are_kept_across_resume(data, tmp_path, capsys):
    """Directives from the site profile and from --directive are saved in launch.toml; `launch --resume` (without
    --site) writes them again, with any new --directive after them."""
    site = tmp_path / "site.toml"
    site.write_text('scheduler = "slurm"\ngpus_per_node = 4\nqos = "regular"\nmpi = "pmi2"\n'
                    'directives = ["--reservation=site", "--mail-type=END"]\n')
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--site", site, "--nodes", 2, "--directive", "--comment=first", "--", "evolve",
                            "--data", data, "--out", out_dir, "--evaluations", 10)
    assert code == 0, err
    first = directives(written(out)[0].read_text(), "#SBATCH")
    assert first[-3:] == ["--reservation=site", "--mail-type=END", "--comment=first"]
    code, out, err = launch(capsys, "--resume", out_dir, "--directive", "--comment=second")
    assert code == 0, err
    text = written(out)[0].read_text()
    follow = directives(text, "#SBATCH")
    assert follow[-4:] == ["--reservation=site", "--mail-type=END", "--comment=first", "--comment=second"]
    assert "--qos=regular" in follow and "--mpi=pmi2" in launch_line(text)
    import tomllib
    saved = tomllib.loads((out_dir / "job" / "launch.toml").read_text())
    assert saved["directives"][-1] == "--comment=second" and saved["qos"] == "regular" and saved["mpi"] == "pmi2"


def test_the_restart_policy_is_written_and_kept_for_follow_ups(data, tmp_path, capsys):
    """--max-restarts and --min-nodes reach the script's `galapagos supervise` line and its comment, and the
    follow-up of `launch --resume`; out of range they are refused, naming the option."""
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 4, "--gpus-per-node", 4, "--max-restarts", 5,
                            "--min-nodes", 3, "--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10)
    assert code == 0, err
    text = written(out)[0].read_text()
    assert "--max-restarts 5 --min-nodes 3 --" in supervise_line(text) and "at most 5 times" in text
    code, out, err = launch(capsys, "--resume", "--run", out_dir)
    assert code == 0, err
    assert "--max-restarts 5 --min-nodes 3 --" in supervise_line(written(out)[0].read_text())
    for args, word in ((["--max-restarts", -1], "--max-restarts -1: must be 0 or more"),
                       (["--min-nodes", 5], "--min-nodes 5: must be 1 to the job's 4 node(s)")):
        code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 4, "--gpus-per-node", 4, *args, "--",
                                "evolve", "--data", data, "--out", tmp_path / "bad", "--evaluations", 10)
        assert code == 2 and word in err, err


def test_follow_ups_work_out_the_lead_time_from_their_own_wall_time(data, tmp_path, capsys):
    """The lead time (SIGUSR1 ahead of the wall time) of a follow-up with another --walltime is a tenth of that
    wall time again (60 to 600 s), not the first job's; a --stop-before given once is kept."""
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--walltime",
                            "10:00", "--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10)
    assert code == 0, err
    assert "--signal=B:USR1@600" in directives(written(out)[0].read_text(), "#SBATCH")
    for extra, lead in ((["--walltime", "00:20"], 120), (["--walltime", "00:50"], 300),
                        (["--walltime", "02:00", "--stop-before", 200], 200), (["--walltime", "05:00"], 200)):
        code, out, err = launch(capsys, "--resume", out_dir, *extra)
        assert code == 0, err
        assert f"--signal=B:USR1@{lead}" in directives(written(out)[0].read_text(), "#SBATCH"), extra
    out_dir = tmp_path / "lsf"
    code, out, err = launch(capsys, "--scheduler", "lsf", "--nodes", 2, "--gpus-per-node", 6, "--cpus-per-node", 42,
                            "--walltime", "10:00", "--", "evolve", "--data", data, "--out", out_dir,
                            "--evaluations", 10)
    assert code == 0 and "-wt 10" in directives(written(out)[0].read_text(), "#BSUB")
    code, out, err = launch(capsys, "--resume", out_dir, "--walltime", "00:20")
    assert code == 0 and "-wt 2" in directives(written(out)[0].read_text(), "#BSUB")


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
                            1, "--submit", "--chain", 1, "--env", f"PYTHONPATH={REPO}", "--", "evolve", "--data",
                            data, "--out", out_dir, "--evaluations", 2, *TINY,
                            "--set", "run.task='tests.faulty_tasks:quick'")  # run.task is imported before the run
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
    from galapagos.launch.scripts import parse_walltime
    from galapagos.launch.scripts.schedulers import _lsf_time

    assert _lsf_time(parse_walltime("00:59:30")) == "01:00" and _lsf_time(parse_walltime("90")) == "01:30"
    assert parse_walltime("2-00:00") == 172800 and parse_walltime("00:01:05") == 65


def test_python_entry_is_the_launch_cli():
    """Run as `python -m galapagos.cli launch --help`: the subcommand is wired into the shared CLI."""
    proc = subprocess.run([sys.executable, "-m", "galapagos.cli", "launch", "--help"], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 0 and "--scheduler" in proc.stdout and "--resume" in proc.stdout
