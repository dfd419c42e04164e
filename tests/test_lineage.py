"""bench/lineage.py's journal reading: a pick's lineage through inherited weights and multi-fidelity promotions,
from a journal written by the run directory's own writer."""
import json

from bench.lineage import main, picks
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir


def _record(i, curve, best, origin="random", parents=None, inherits=None):
    return JournalRecord(id=i, genome={}, status="ok", fitness=max(curve), curve=curve, params=100 + i,
                         metrics={"best_epoch": best, "train_loss": 0.5 - i / 100}, origin=origin,
                         parents=parents, inherits=inherits)


def _run(path, records, best):
    run = RunDir(path)
    path.mkdir()
    for r in records:
        run.append(r)
    run.close()
    (path / "summary.json").write_text(json.dumps({"best": {"id": best}}))
    return path


def test_pick_line_follows_inherited_weights_and_counts_promotions_once(tmp_path, capsys):
    records = [_record(0, [0.1, 0.2, 0.3], 3),
               _record(1, [0.2, 0.4, 0.3], 2, "mutation", [0], inherits=0),
               _record(2, [0.5, 0.6], 5, "promoted", [1]),  # rung 1 of 1's training: best at epoch 5 of all its own
               _record(3, [0.7, 0.6, 0.5], 1, "crossover", [2, 0], inherits=2),
               _record(4, [0.9], 1)]  # a fresh start outside the line
    _run(tmp_path / "x-evolution-0", records, best=3)
    assert picks(tmp_path / "x-evolution-0") == {
        "id": 3, "val": 0.7, "train_loss": 0.47, "params": 103, "best_epoch": 1,
        # 3, then 2 (with its earlier rung 1), then 0: three trainings
        "generations": 3, "epochs": 3 + 2 + 3 + 3, "carried": 1 + 5 + 3}
    _run(tmp_path / "x-evolution-1", records, best=4)
    (tmp_path / "x-evolution-2").mkdir()  # an abandoned run (no summary) is left out
    main(["--picks", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| x-evolution-0 | 3 | 0.7000 | 0.4700 | 103 | 3 | 11 | 9 | 1 |",
                         "| x-evolution-1 | 4 | 0.9000 | 0.4600 | 104 | 1 | 1 | 1 | 1 |"]
