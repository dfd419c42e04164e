"""The journal survives a kill mid-write and keeps its line format; a run directory is never mixed with another
run."""
import json

import pytest

from galapagos.evolve.genome import Genome
from galapagos.launch.protocol import Result, Status
from galapagos.store.journal import JournalRecord, journal_record
from galapagos.store.rundir import RunDir, RunDirError

GENOME = {"batch_size": 32, "head": "avg", "layers": [{"act": "relu", "type": "dense", "units": 8}], "lr": 0.001,
          "optimizer": "adam", "weight_decay": 0.0}
# Lines as the writer made them before JournalRecord: an evaluation (its genome written last, as canonical JSON) and
# an ensemble member, with every key each kind had.
EVALUATION = ('{"curve": [0.5, 0.8125], "end": 1700000012.5, "error": null, "fitness": 0.8125, "host": "node1", '
              '"id": 7, "inherits": 3, "key": "75125354a5324ffd", "metrics": {"latency_ms": 0.25, "val_loss": 0.5}, '
              '"origin": "crossover", "params": 1234, "parents": [3, 5], "rank": 2, "start": 1700000000.25, '
              '"status": "ok", "genome": {"batch_size":32,"head":"avg","layers":[{"act":"relu","type":"dense",'
              '"units":8}],"lr":0.001,"optimizer":"adam","weight_decay":0.0}}')
MEMBER = ('{"curve": [], "end": 2.0, "error": "Traceback\\nTimeout", "fitness": null, "genome": {"batch_size": 32, '
          '"head": "avg", "layers": [{"act": "relu", "type": "dense", "units": 8}], "lr": 0.001, "optimizer": "adam", '
          '"weight_decay": 0.0}, "host": "node2", "id": 1, "key": "75125354a5324ffd", "metrics": {}, "name": '
          '"m01-e7", "origin": {"fitness": 0.8125, "id": 7, "kind": "distinct", "run": "/r"}, "params": 1234, '
          '"rank": 1, "seed": 2147483649, "start": 1.0, "status": "timeout"}')


def rec(i: int, fitness: float | None = 0.5) -> JournalRecord:
    return JournalRecord(i, GENOME, "ok", fitness)


def test_the_writer_makes_the_lines_it_always_made_and_reads_them_back(tmp_path):
    genome = Genome.from_json(GENOME)
    evaluation = journal_record(
        Result(7, 2, "node1", Status.OK, 0.8125, 1700000000.25, 1700000012.5, {"val_loss": 0.5, "latency_ms": 0.25}),
        [0.5, 0.8125], {"parents": [3, 5], "origin": "crossover", "genome": genome, "key": genome.key,
                        "params": 1234, "inherits": 3})
    member = journal_record(
        Result(1, 1, "node2", Status.TIMEOUT, None, 1.0, 2.0, {}, "Traceback\nTimeout"), [],
        {"name": "m01-e7", "genome": GENOME, "key": genome.key, "seed": 2147483649, "params": 1234,
         "origin": {"run": "/r", "id": 7, "kind": "distinct", "fitness": 0.8125}})
    assert [evaluation.to_line(), member.to_line()] == [EVALUATION, MEMBER]
    run = RunDir.open(tmp_path / "r", resume=False)
    run.append(evaluation)
    run.append(member)
    run.close()
    assert run.journal.read_text() == EVALUATION + "\n" + MEMBER + "\n"
    back = run.read_journal()
    assert back == [JournalRecord.from_dict(json.loads(EVALUATION)), JournalRecord.from_dict(json.loads(MEMBER))]
    assert [r.to_dict() for r in back] == [json.loads(EVALUATION), json.loads(MEMBER)]
    assert back[0].genome == GENOME and back[0].to_line() != EVALUATION  # a dict genome is written in key order
    for made, read in zip((evaluation, member), back):
        assert made.to_dict() == {**read.to_dict(), "genome": made.genome}


def test_a_line_written_before_journal_record_reads_back(tmp_path):
    run = RunDir(tmp_path)
    run.journal.write_text(EVALUATION + "\n" + MEMBER + "\n")
    evaluation, member = run.read_journal()
    assert (evaluation.id, evaluation.status, evaluation.fitness, evaluation.parents, evaluation.origin,
            evaluation.inherits, evaluation.params, evaluation.curve, evaluation.rank, evaluation.host,
            evaluation.start, evaluation.end, evaluation.error) == (7, "ok", 0.8125, [3, 5], "crossover", 3, 1234,
                                                                    [0.5, 0.8125], 2, "node1", 1700000000.25,
                                                                    1700000012.5, None)
    assert evaluation.metrics == {"latency_ms": 0.25, "val_loss": 0.5} and evaluation.genome == GENOME
    assert (evaluation.name, evaluation.seed) == (None, None)
    assert (member.name, member.seed, member.origin["kind"], member.status, member.fitness, member.parents,
            member.inherits) == ("m01-e7", 2147483649, "distinct", "timeout", None, None, None)
    assert member.error == "Traceback\nTimeout"


def test_keys_a_line_lacks_take_their_defaults_and_unknown_ones_are_left_out():
    r = JournalRecord.from_dict({"id": 3, "genome": GENOME, "status": "failed", "later": 1})
    assert (r.fitness, dict(r.metrics), list(r.curve), r.parents, r.origin, r.key, r.params) == (
        None, {}, [], None, None, None, None)
    assert r.to_dict()["metrics"] == {} and r.to_dict()["curve"] == ()  # written as {} and []
    with pytest.raises(TypeError, match="status"):
        JournalRecord.from_dict({"id": 3, "genome": GENOME})


def test_torn_last_line_is_dropped_and_cut(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    run.append(rec(0))
    run.append(rec(1, None))
    run.flush()
    with open(run.journal, "a") as f:
        f.write('{"id": 2, "fitn')
    size = run.journal.stat().st_size
    assert [r.id for r in run.read_journal()] == [0, 1]  # a reader (of a live run, maybe) leaves it as it is
    assert run.journal.stat().st_size == size
    assert [r.id for r in run.read_journal(repair=True)] == [0, 1]  # the job about to write cuts it off
    run.append(rec(3))
    run.flush()
    assert [json.loads(x)["id"] for x in run.journal.read_text().splitlines()] == [0, 1, 3]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    run.journal.write_text(rec(0).to_line() + '\nnot json\n' + rec(2).to_line() + '\n')
    with pytest.raises(RunDirError, match="results.jsonl:2: not a JSON line"):
        run.read_journal()
    run.journal.write_text(rec(0).to_line() + '\n{"id": 1}\n')
    with pytest.raises(RunDirError, match="results.jsonl:2: not a journal record"):
        run.read_journal()


def test_open_refuses_to_mix_runs(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    run.append(rec(0))
    run.flush()
    with pytest.raises(RunDirError, match="already holds a run"):
        RunDir.open(tmp_path / "r", resume=False)
    with pytest.raises(RunDirError, match="no run to resume"):
        RunDir.open(tmp_path / "other", resume=True)
    nested = RunDir.open(tmp_path / "a" / "b", resume=False)  # missing parents are made, as `mkdir -p` would
    assert nested.path.is_dir()
    nested.hold()
    nested.discard()  # a refused new run leaves nothing behind, the parents it made included
    assert not (tmp_path / "a").exists()
    (tmp_path / "f").write_text("")
    with pytest.raises(RunDirError, match="is not a directory"):
        RunDir.open(tmp_path / "f" / "b", resume=False)


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "x").write_text("")
    for resume in (False, True):
        with pytest.raises(RunDirError, match=f"^--out {tmp_path / 'x'}: exists and is not a directory$"):
            RunDir.check(tmp_path / "x", resume=resume)


def test_nan_never_reaches_the_journal(tmp_path):
    run = RunDir.open(tmp_path / "r", resume=False)
    with pytest.raises(ValueError):
        run.append(rec(0, float("nan")))
