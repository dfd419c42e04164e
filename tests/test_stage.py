"""`launch --stage DIR`: the environment (packed once) and the data copied to each node's local storage before the
ranks start, the command run from the copy, the copy removed after the run."""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from galapagos.launch.scripts import SCHEDULERS_ORDER, build_request, render
from galapagos.launch.scripts.stage import environment, pack_environment
from tests.test_jobscript import TINY, command_array, data, launch, supervise_line  # noqa: F401 - fixture

PER_NODE = {"pbs": "mpiexec -n 2 --ppn 1", "alps": "aprun -n 2 -N 1", "lsf": "jsrun -n 2 -r 1 -a 1 -c 1",
            "flux": "flux run -N 2 -n 2", "slurm": "srun --nodes=2 --ntasks=2 --ntasks-per-node=1"}


def test_the_environment_is_packed_once(tmp_path):
    prefix = tmp_path / "env"
    (prefix / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (prefix / "bin").mkdir()
    (prefix / "lib" / "python3.11" / "site-packages" / "mod.py").write_text("x = 1\n")
    tar = pack_environment(prefix, tmp_path / "job")
    made = tar.stat().st_mtime_ns
    assert pack_environment(prefix, tmp_path / "job") == tar and tar.stat().st_mtime_ns == made
    time.sleep(0.01)
    (prefix / "lib" / "python3.11" / "site-packages" / "new.py").write_text("y = 2\n")  # a package installed
    assert pack_environment(prefix, tmp_path / "job").stat().st_mtime_ns > made
    subprocess.run(["tar", "-xf", str(tar), "-C", str(tmp_path)], check=True)
    assert (tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "new.py").exists()


@pytest.mark.parametrize("scheduler", [s for s in SCHEDULERS_ORDER if s != "local"])
def test_staged_scripts(scheduler, data, tmp_path):  # noqa: F811
    opts = {"scheduler": scheduler, "nodes": 2, "gpus_per_node": 4, "cpus_per_node": 42, "walltime": "01:00",
            "program": "galapagos", "stage": "/mnt/bb/$USER"}
    cmd = ("evolve", "--data", str(data), "--out", str(tmp_path / "run"), "--evaluations", "4")
    req = replace(build_request(opts, cmd, tmp_path / "run", script=tmp_path / "run" / "job" / "s.sh"),
                  stage_data=str(data))  # what `launch` takes from the command's --data
    text, _ = render(req)
    lines = text.splitlines()
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    named = next(i for i, line in enumerate(lines) if line.startswith('stage="/mnt/bb/$USER/galapagos-'))
    assert named < next(i for i, line in enumerate(lines) if line.startswith("command=("))
    words = next(line for line in lines if line.startswith("command=("))
    assert words.startswith(f'command=("$stage/{environment().name}/bin/python" -m galapagos.cli evolve')
    assert f'--data "$stage/{data.name}"' in words
    copies = [line for line in lines if PER_NODE[scheduler] in line]
    start = lines.index(supervise_line(text) + " &")
    assert copies and all(lines.index(c) < start for c in copies[:-1])  # filled before the ranks start
    assert copies[-1].endswith('rm -rf "$stage" || true') and lines.index(copies[-1]) > start  # removed after
    if scheduler == "slurm":
        assert [line.split()[0] for line in lines if line.startswith("sbcast")] == ["sbcast", "sbcast"]


def test_stage_must_be_a_node_local_absolute_directory(data, tmp_path, capsys):  # noqa: F811
    code, _, err = launch(capsys, "--scheduler", "slurm", "--nodes", 1, "--gpus-per-node", 1, "--stage", "scratch",
                          "--", "galapagos", "evolve", "--data", data, "--out", tmp_path / "run", "--evaluations", 2)
    assert code == 2 and "--stage 'scratch': expected an absolute directory" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.mpi
def test_a_staged_local_job_runs_from_the_copy(data, tmp_path, capsys):  # noqa: F811
    out, local = tmp_path / "run", tmp_path / "node-local"
    code, said, err = launch(capsys, "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0,
                             "--workers-per-node", 1, "--stage", local, "--submit", "--env",
                             f"PYTHONPATH={Path(__file__).parents[1]}", "--", "galapagos", "evolve", "--data", data,
                             "--out", out, "--evaluations", 2, *TINY)
    assert code == 0, err
    assert "environment packed for staging" in said
    deadline = time.time() + 240
    while not (out / "summary.json").exists() and time.time() < deadline:
        time.sleep(1)
    log = next((out / "job").glob("local-*.out")).read_text()
    assert (out / "summary.json").exists(), log
    assert json.loads((out / "data.json").read_text())["path"].startswith(str(local)), log  # read from the copy
    deadline = time.time() + 120  # removing the unpacked environment (a GiB of files) takes a while on a busy node
    while any(local.iterdir()) and time.time() < deadline:  # the script removes it once the launcher is done
        time.sleep(0.5)
    assert not any(local.iterdir()), os.listdir(local)
