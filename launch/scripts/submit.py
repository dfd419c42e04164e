"""Handing a job script to its scheduler: the submitter's job id, or its error as one clear line."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from galapagos.launch.scripts.request import JobScriptError
from galapagos.launch.scripts.schedulers import SCHEDULERS

SUBMIT_TIMEOUT = 120.0


def submit(scheduler: str, script: Path) -> str:
    """Submit `script` and return the job id (for `local`: start it in the background; the id is its process id)."""
    sched = SCHEDULERS[scheduler]
    if scheduler == "local":  # detached (its parent exits at once), so that it outlives this command
        detach = 'nohup setsid bash "$0" >>"$1" 2>&1 </dev/null & echo $!'
        proc = subprocess.run(["bash", "-c", detach, str(script), str(script.with_suffix(".out"))],
                              capture_output=True, text=True, check=False, timeout=SUBMIT_TIMEOUT)
        if proc.returncode != 0 or not proc.stdout.strip().isdigit():
            raise JobScriptError(f"could not start {script}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout.strip()
    cmd = [*sched.submit, *([] if sched.stdin else [str(script)])]
    try:
        proc = subprocess.run(cmd, input=script.read_text() if sched.stdin else None, capture_output=True,
                              text=True, check=False, timeout=SUBMIT_TIMEOUT)
    except FileNotFoundError:
        raise JobScriptError(f"{cmd[0]} not found: this machine has no {scheduler} scheduler (the script is written: "
                         f"{script})") from None
    except subprocess.TimeoutExpired:
        raise JobScriptError(f"{cmd[0]} did not answer within {SUBMIT_TIMEOUT:.0f} s (the script is written: "
                         f"{script})") from None
    if proc.returncode != 0:
        why = " ".join((proc.stderr or proc.stdout).split()) or "no message"
        raise JobScriptError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {why}")
    match = re.search(sched.job_id, proc.stdout, re.MULTILINE)
    if not match:
        raise JobScriptError(f"no job id in what {cmd[0]} printed: {proc.stdout.strip()!r}")
    return match.group(1)


def is_active(scheduler: str, job_id: str) -> bool:
    """True while the job is queued or running, as far as the scheduler can say (False when it cannot)."""
    if scheduler == "local":
        try:
            os.kill(int(job_id), 0)
        except (ValueError, OSError):
            return False
        return True
    sched = SCHEDULERS[scheduler]
    if not sched.active:
        return False
    try:
        proc = subprocess.run([*sched.active, job_id], capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and sched.still_active(proc.stdout)
