"""`report --csv` and `--json` as a script or a spreadsheet reads them: one params_<name> column per genome
parameter, start and end as ISO-8601 UTC times, the genome as a dict; and the report's own figures (parameter
importance, the Pareto front) on a journal whose answer is known."""
from __future__ import annotations

import csv
import json
from datetime import datetime

import pytest

from galapagos.evolve.genome import Genome
from galapagos.reports import html, tables
from tests.test_report_page import cli, make_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("tables") / "run")


def journal(run) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def test_csv_has_a_column_per_genome_parameter_and_iso_times(run, tmp_path):
    proc = cli("report", run, "--csv", tmp_path / "r.csv")
    assert proc.returncode == 0 and f"wrote {tmp_path / 'r.csv'} (24 rows)" in proc.stdout, proc.stderr
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    lines = journal(run)
    assert len(rows) == len(lines) == 24
    for row, line in zip(rows, lines):
        genome = Genome.from_json(line["genome"])
        assert (row["params_optimizer"], float(row["params_lr"]), int(row["params_batch_size"])) == (
            genome.optimizer, genome.lr, genome.batch_size)
        assert int(row["params_layers"]) == 3 and row["params_conv_layers"] == "1" and row["params_pool_layers"] == "1"
        assert int(row["params_max_channels"]) == genome.layers[0]["channels"]
        assert int(row["params_max_units"]) == genome.layers[2]["units"] and row["params_max_dropout"] == ""
        assert row["end"].endswith("Z") and datetime.fromisoformat(row["end"]).timestamp() == pytest.approx(
            line["end"], abs=1e-3)
        assert float(row["seconds"]) == pytest.approx(line["end"] - line["start"], abs=1e-3)
    header = list(rows[0])
    assert header[:4] == ["id", "status", "fitness", "params"]
    assert header.index("params_optimizer") < header.index("metric_latency_ms")


def test_json_gives_the_genome_as_a_dict(run):
    proc = cli("report", run, "--json", "--top", 3)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_id = {line["id"]: line for line in journal(run)}
    best = report["best"]
    assert best["genome"] == by_id[best["id"]]["genome"] and isinstance(best["genome"]["layers"], list)
    assert best["network"] == Genome.from_json(best["genome"]).describe()
    assert [t["genome"] for t in report["top"]] == [by_id[t["id"]]["genome"] for t in report["top"]]
    text = cli("report", run).stdout
    assert f"best network: {best['network']}" in text


def test_importance_and_the_pareto_front(run):
    data = html.payload(run)
    assert data["importance"][-1]["name"] == "lr"  # the made-up run's fitness is decided by lr alone
    assert all(0 <= d["eta2"] <= 1 for d in data["importance"])
    ok = [e for e in data["evaluations"] if e["status"] == "ok"]
    front = data["fronts"]["params"]
    assert front and all(not any(o["fitness"] >= e["fitness"] and o["size"] <= e["size"] and o["id"] != e["id"]
                                 and (o["fitness"], o["size"]) != (e["fitness"], e["size"]) for o in ok)
                         for e in ok if e["id"] in front)
    assert max(ok, key=lambda e: e["fitness"])["id"] in front


def test_a_line_being_written_is_left_for_the_next_read(run, tmp_path):
    """The live report reads a journal the master appends to: a last line without its newline is not read and
    not cut off (read_journal would cut it)."""
    copy = tmp_path / "run"
    copy.mkdir()
    text = (run / "results.jsonl").read_text()
    (copy / "results.jsonl").write_text(text + text.splitlines()[0][:40])
    records, size = html.read_records(copy)
    assert len(records) == 24 and size == len(text.encode())
    assert (copy / "results.jsonl").read_text().endswith(text.splitlines()[0][:40])


def test_rows_as_a_data_frame(run):
    pd = pytest.importorskip("pandas")
    frame = tables.frame(run)
    assert len(frame) == 24 and {"params_lr", "params_optimizer", "metric_val_accuracy"} <= set(frame.columns)
    assert pd.to_datetime(frame["end"], utc=True).is_monotonic_increasing
