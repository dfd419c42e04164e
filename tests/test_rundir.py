"""The journal survives a kill mid-write; a run directory is never mixed with another run."""
import json

import pytest

from galapagos.store.rundir import RunDir, RunDirError


def test_torn_last_line_is_dropped_and_cut(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    run.append({"id": 0, "fitness": 0.5})
    run.append({"id": 1, "fitness": None})
    run.flush()
    with open(run.journal, "a") as f:
        f.write('{"id": 2, "fitn')
    assert [r["id"] for r in run.read_journal()] == [0, 1]
    run.append({"id": 3})
    run.flush()
    assert [json.loads(x)["id"] for x in run.journal.read_text().splitlines()] == [0, 1, 3]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    run.journal.write_text('{"id": 0}\nnot json\n{"id": 2}\n')
    with pytest.raises(RunDirError, match="results.jsonl:2"):
        run.read_journal()


def test_open_refuses_to_mix_runs(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    run.append({"id": 0})
    run.flush()
    with pytest.raises(RunDirError, match="already holds a run"):
        RunDir.open(tmp_path / "r", resume=False)
    with pytest.raises(RunDirError, match="no run to resume"):
        RunDir.open(tmp_path / "other", resume=True)
    with pytest.raises(RunDirError, match="does not exist"):
        RunDir.open(tmp_path / "a" / "b", resume=False)


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "x").write_text("")
    for resume in (False, True):
        with pytest.raises(RunDirError, match=f"^--out {tmp_path / 'x'}: exists and is not a directory$"):
            RunDir.check(tmp_path / "x", resume=resume)


def test_nan_never_reaches_the_journal(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    with pytest.raises(ValueError):
        run.append({"fitness": float("nan")})
