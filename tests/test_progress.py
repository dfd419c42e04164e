"""What a run shows: a live bar drawn on the user's terminal by the process that started the job (from rank 0's
snapshots), plain log lines in a batch job."""
import io
import json
import logging
import os
import pty
import re
import subprocess
import sys

from galapagos.reports.progress import ProgressBar, ProgressView, Snapshot, line
from tests.mpirun import REPO
from tests.test_evolve_run import SMALL, shapes_file  # noqa: F401 - fixture


def snap(**kw):
    base = dict(done=12, total=40, best=0.8734, busy=3, workers=4, elapsed=95.0, remaining=None,
                by_status={"ok": 9, "pruned": 2, "failed": 1}, rate=7.6)
    return Snapshot(**{**base, **kw})


def test_line_says_what_a_user_wants():
    text = line(snap())
    for words in ("evals 12/40", "ok 9 pruned 2 failed 1", "best 0.8734", "7.6/min", "busy 3/4", "1:35 elapsed",
                  "~3:41 left"):  # 28 to go at 7.6 a minute
        assert words in text, text
    assert "2:00 left" in line(snap(total=None, remaining=120.0))
    assert "best -" in line(snap(best=None, done=0, by_status={}, rate=0.0))
    assert "none finished" in line(snap(by_status={}))


def test_plain_lines_when_no_one_draws_a_bar(caplog, monkeypatch):
    monkeypatch.delenv("GALAPAGOS_PROGRESS_FILE", raising=False)
    view = ProgressView(every=3600)
    with caplog.at_level(logging.INFO, logger="galapagos"):
        view.show(snap(), force=True)
        view.show(snap(done=13))  # not forced, within `every`: no new line
        view.show(snap(done=14), force=True)
    assert [r.getMessage().split(" |")[0] for r in caplog.records] == ["evals 12/40", "evals 14/40"]


def test_snapshots_reach_the_bar(tmp_path, caplog):
    relay = tmp_path / "progress.json"
    view = ProgressView(relay=str(relay))
    with caplog.at_level(logging.INFO, logger="galapagos"):
        view.show(snap(done=20), force=True)
    assert not caplog.records  # the bar shows it: no log line
    assert json.loads(relay.read_text())["done"] == 20
    out = io.StringIO()
    bar = ProgressBar(relay, out)
    bar.write("a line from a rank\n")
    bar.refresh()
    bar.write("another line\n")
    bar.close()
    text = out.getvalue()
    assert "a line from a rank" in text and "another line" in text
    assert "20/40" in text and "ok 9 pruned 2 failed 1" in text and "busy 3/4" in text


def test_the_command_draws_a_bar_on_a_terminal(shapes_file, tmp_path):  # noqa: F811
    """`galapagos evolve` on a real pseudo-terminal: the bar with counts by status, the ranks' lines above it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO)
    main, tty = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(shapes_file), "--out",
                             str(tmp_path / "run"), "--evaluations", "6", "--workers", "2", *SMALL], cwd=REPO,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=tty)
    os.close(tty)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal's other end closed: the command is done
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = proc.communicate(timeout=300)
    os.close(main)
    assert proc.returncode == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert re.search(r"6/6 .*ok \d.*busy \d/2", text), text
    assert "evolving networks" in text  # rank 0's log line, printed above the bar
    assert b"evaluations: 6" in stdout
