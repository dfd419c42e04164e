"""Handing a job script to its scheduler (launch.scripts.submit), against fake scheduler commands on PATH."""
from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from galapagos.launch.scripts import JobScriptError
from galapagos.launch.scripts.submit import is_active, submit
from tests.test_jobscript import data, launch  # noqa: F401 - fixture

# A fake scheduler command: records its arguments (and, for bsub, its standard input), then answers as told by
# FAKE_<NAME>_OUT / _ERR / _RC, so that one test can script each command separately.
FAKE = """#!/bin/sh
: > "$FAKE_DIR/{name}.args"
for a in "$@"; do printf '%s\\n' "$a" >> "$FAKE_DIR/{name}.args"; done
{read_stdin}
printf '%s' "$FAKE_{var}_ERR" >&2
printf '%s' "$FAKE_{var}_OUT"
exit "${{FAKE_{var}_RC:-0}}"
"""
COMMANDS = ("sbatch", "squeue", "bsub", "bjobs", "qsub", "qstat", "flux")


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    """A directory of fake scheduler commands first on PATH; returns a helper to script and inspect them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in COMMANDS:
        path = bin_dir / name
        read = 'cat > "$FAKE_DIR/bsub.stdin"' if name == "bsub" else ""
        path.write_text(FAKE.format(name=name, var=name.upper(), read_stdin=read))
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    return Fakes(tmp_path, monkeypatch)


class Fakes:
    def __init__(self, root: Path, monkeypatch):
        self.root, self.mp = root, monkeypatch

    def answer(self, name: str, out: str = "", err: str = "", rc: int = 0) -> None:
        var = name.upper()
        self.mp.setenv(f"FAKE_{var}_OUT", out)
        self.mp.setenv(f"FAKE_{var}_ERR", err)
        self.mp.setenv(f"FAKE_{var}_RC", str(rc))

    def args(self, name: str) -> list[str]:
        return (self.root / f"{name}.args").read_text().splitlines()

    def called(self, name: str) -> bool:
        return (self.root / f"{name}.args").exists()

    def stdin(self, name: str) -> str:
        return (self.root / f"{name}.stdin").read_text()


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job" / "galapagos-job.sh"
    path.parent.mkdir()
    path.write_text("#!/bin/bash\n#SBATCH --nodes=2\necho the job body\n")
    return path


# -- the job id of each submitter ----------------------------------------------------------------------------------
@pytest.mark.parametrize("out", ["12345\n", "12345;cluster\n", "12345"])
def test_sbatch_parsable_gives_the_job_id(fakes, script, out):
    fakes.answer("sbatch", out)
    assert submit("slurm", script) == "12345"
    assert fakes.args("sbatch") == ["--parsable", str(script)]


def test_bsub_reads_the_script_on_stdin(fakes, script):
    fakes.answer("bsub", "Job <678> is submitted to queue <batch>.\n")
    assert submit("lsf", script) == "678"
    assert fakes.stdin("bsub") == script.read_text()
    assert fakes.args("bsub") == []  # the script is not also passed as an argument


def test_bsub_job_id_after_other_lines(fakes, script):
    fakes.answer("bsub", "Warning: project not set, using default\nJob <91011> is submitted to default queue "
                         "<normal>.\n")
    assert submit("lsf", script) == "91011"


@pytest.mark.parametrize("scheduler", ["pbs", "alps"])
def test_qsub_gives_the_full_job_id(fakes, script, scheduler):
    fakes.answer("qsub", "123.pbs01\n")
    assert submit(scheduler, script) == "123.pbs01"
    assert fakes.args("qsub") == [str(script)]


def test_flux_batch_gives_the_job_id(fakes, script):
    fakes.answer("flux", "\u0192A1b2C3d\n")
    assert submit("flux", script) == "\u0192A1b2C3d"
    assert fakes.args("flux") == ["batch", str(script)]


# -- errors --------------------------------------------------------------------------------------------------------
def test_a_failing_submitter_names_the_command_and_its_message(fakes, script):
    fakes.answer("sbatch", err="sbatch: error: Batch job submission failed: Invalid account or account/partition "
                               "combination specified\n", rc=1)
    with pytest.raises(JobScriptError) as info:
        submit("slurm", script)
    text = str(info.value)
    assert "sbatch --parsable" in text and str(script) in text
    assert "exit 1" in text
    assert "Invalid account or account/partition combination specified" in text
    assert "\n" not in text  # one line


def test_a_failing_submitter_without_stderr_shows_its_stdout(fakes, script):
    fakes.answer("qsub", out="qsub: Job rejected by all possible destinations\n", rc=38)
    with pytest.raises(JobScriptError, match=r"qsub .*exit 38.*Job rejected by all possible destinations"):
        submit("pbs", script)


def test_a_silent_failure_says_so(fakes, script):
    fakes.answer("bsub", rc=255)
    with pytest.raises(JobScriptError, match=r"bsub failed \(exit 255\): no message"):
        submit("lsf", script)


@pytest.mark.parametrize("scheduler, command", [("slurm", "sbatch"), ("lsf", "bsub"), ("pbs", "qsub"),
                                                ("flux", "flux")])
def test_a_missing_submitter_says_the_machine_has_no_such_scheduler(tmp_path, monkeypatch, script, scheduler,
                                                                      command):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(JobScriptError) as info:
        submit(scheduler, script)
    text = str(info.value)
    assert f"{command} not found" in text
    assert f"no {scheduler} scheduler" in text
    assert str(script) in text  # where the written script is, to submit by hand


@pytest.mark.parametrize("scheduler, command, out", [
    ("slurm", "sbatch", "sbatch: submitted, maybe\n"),
    ("slurm", "sbatch", ""),
    ("lsf", "bsub", "Request aborted by esub. Job not submitted.\n"),
    ("pbs", "qsub", ""),
])
def test_output_without_a_job_id_is_an_error(fakes, script, scheduler, command, out):
    fakes.answer(command, out)
    with pytest.raises(JobScriptError, match=f"no job id in what {command} printed"):
        submit(scheduler, script)


# -- is_active ------------------------------------------------------------------------------------------------------
def test_squeue_with_a_line_means_active(fakes):
    fakes.answer("squeue", "  12345     batch galapago  alice  R   0:42   2 node[01-02]\n")
    assert is_active("slurm", "12345") is True
    assert fakes.args("squeue") == ["--noheader", "--jobs", "12345"]


def test_squeue_with_nothing_means_ended(fakes):
    fakes.answer("squeue", "")
    assert is_active("slurm", "12345") is False
    fakes.answer("squeue", "\n  \n")
    assert is_active("slurm", "12345") is False


def test_squeue_failing_means_not_active(fakes):
    fakes.answer("squeue", "  12345 batch x alice R 0:01 1 n1\n",
                 err="slurm_load_jobs error: Invalid job id specified\n", rc=1)
    assert is_active("slurm", "12345") is False


def test_other_schedulers_ask_their_own_command(fakes):
    fakes.answer("bjobs", "678 alice RUN batch host1 host2 galapagos Jan 1 10:00\n")
    assert is_active("lsf", "678") is True
    assert fakes.args("bjobs") == ["-noheader", "678"]
    fakes.answer("qstat", "")
    assert is_active("pbs", "123.pbs01") is False
    assert fakes.args("qstat") == ["123.pbs01"]


@pytest.mark.parametrize("state", ["DEPEND", "PRIORITY", "SCHED", "RUN", "CLEANUP"])
def test_flux_jobs_state_of_a_queued_or_running_job_means_active(fakes, state):
    """`flux jobs` lists exactly the ids it is given whatever --filter says (flux-jobs(1): "Filtering options ignored
    with jobid list"), so the job's {state} is what tells an active job from a finished one."""
    fakes.answer("flux", f"{state}\n")
    assert is_active("flux", "\u0192A1b2C3d") is True
    assert fakes.args("flux") == ["jobs", "-n", "--format={state}", "\u0192A1b2C3d"]


def test_flux_jobs_inactive_or_unknown_means_ended(fakes):
    fakes.answer("flux", "INACTIVE\n")
    assert is_active("flux", "\u0192A1b2C3d") is False
    fakes.answer("flux", "")
    assert is_active("flux", "\u0192A1b2C3d") is False
    fakes.answer("flux", err="flux-jobs: ERROR: job \u0192A1b2C3d not found\n", rc=1)
    assert is_active("flux", "\u0192A1b2C3d") is False


def test_no_query_command_means_not_active(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert is_active("slurm", "12345") is False  # no squeue on this machine
    assert is_active("flux", "\u0192A1b2C3d") is False  # no flux either


# -- launch --resume and --chain with a scheduler that answers -----------------------------------------------------
def test_resume_waits_for_a_flux_job_that_is_still_active(fakes, data, tmp_path, capsys):  # noqa: F811
    """`launch --resume` asks flux whether the last job is still queued or running and, if so, depends on it."""
    flux = tmp_path / "bin" / "flux"  # `flux batch` prints the id, `flux jobs` the state: FAKE_FLUX_STATE
    flux.write_text('#!/bin/sh\nprintf \'%s\\n\' "$@" >> "$FAKE_DIR/flux.args"\n'
                    'if [ "$1" = batch ]; then echo "\u0192A1b2C3d"; else echo "$FAKE_FLUX_STATE"; fi\n')
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--scheduler", "flux", "--nodes", 2, "--gpus-per-node", 4, "--submit", "--",
                            "evolve", "--data", data, "--out", out_dir, "--evaluations", 10)
    assert code == 0 and "submitted: flux job \u0192A1b2C3d" in out, err
    for state, waits in (("SCHED", True), ("RUN", True), ("INACTIVE", False)):
        fakes.mp.setenv("FAKE_FLUX_STATE", state)
        code, out, err = launch(capsys, "--resume", out_dir)
        assert code == 0, err
        text = Path(out.splitlines()[-1].split(": ", 1)[1]).read_text()
        assert ("# flux: --dependency=afterany:\u0192A1b2C3d" in text) is waits, state
        assert ("waits for job \u0192A1b2C3d" in out) is waits
    assert "--format={state}" in (tmp_path / "flux.args").read_text()


def test_chained_follow_ups_take_the_lead_time_of_their_own_wall_time(fakes, data, tmp_path, capsys):  # noqa: F811
    """A run started with a 10-hour wall time (lead 600 s), resumed with --walltime 00:30 --submit --chain 1:
    the follow-up and its chained follow-up both stop 180 s (a tenth) ahead, and the second waits for the first."""
    fakes.answer("sbatch", "4242\n")
    fakes.answer("squeue", "")
    out_dir = tmp_path / "run"
    code, out, err = launch(capsys, "--scheduler", "slurm", "--nodes", 2, "--gpus-per-node", 4, "--walltime",
                            "10:00", "--", "evolve", "--data", data, "--out", out_dir, "--evaluations", 10)
    assert code == 0, err
    code, out, err = launch(capsys, "--resume", out_dir, "--walltime", "00:30", "--submit", "--chain", 1)
    assert code == 0, err
    scripts = [Path(x.split(": ", 1)[1]) for x in out.splitlines() if x.startswith("script: ")]
    assert len(scripts) == 2
    for script in scripts:
        text = script.read_text()
        assert "#SBATCH --signal=B:USR1@180" in text and "#SBATCH --time=00:30:00" in text
    assert "#SBATCH --dependency=afterany:4242" in scripts[1].read_text()


# -- local ---------------------------------------------------------------------------------------------------------
def wait_for(predicate, timeout: float = 30.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_local_starts_the_script_in_the_background(tmp_path):
    started, release, done = tmp_path / "started", tmp_path / "release", tmp_path / "done"
    script = tmp_path / "local-job.sh"
    script.write_text(f"""#!/bin/bash
echo "running as $$"
touch {started}
for i in $(seq 600); do [ -e {release} ] && break; sleep 0.05; done
echo finished
touch {done}
""")
    t0 = time.time()
    pid = submit("local", script)
    assert time.time() - t0 < 10  # it did not wait for the job
    assert pid.isdigit()
    assert wait_for(started.exists), "the script never started"
    assert is_active("local", pid) is True
    assert not done.exists()
    release.touch()
    assert wait_for(done.exists), "the script never finished"
    # (a finished job may linger as a zombie until init reaps it: give it time)
    assert wait_for(lambda: not is_active("local", pid)), f"process {pid} still counts as active"
    out = script.with_suffix(".out").read_text()
    assert f"running as {pid}" in out  # the id returned is the script's own process
    assert "finished" in out


def test_local_is_active_is_false_for_nonsense_and_dead_ids():
    assert is_active("local", "not-a-pid") is False
    assert is_active("local", "") is False
    assert is_active("local", str(2**22 + 12345)) is False  # beyond pid_max: no such process
