"""`report --html/--csv/--json`: a design run's report opened in a real headless browser (every plot decoded),
the ensemble directory's own report, another run beside it, the journal as a flat table."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - fixture

pytestmark = pytest.mark.mpi
RUN_PLOTS = 7  # progress, size, latency, curves, timeline, genealogy, status
ENSEMBLE_PLOTS = 2  # members and weights; calibration and uncertainty


@pytest.fixture(scope="module")
def design(shapes_file, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("html") / "design"
    proc = galapagos("design", "--data", shapes_file, "--out", out, "--evaluations", 8, "--workers", 2, "--members",
                     2, *SMALL, "--set", "ensemble.epochs=1", timeout=400)
    assert proc.returncode == 0, proc.stderr
    return out


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.skip("no headless browser (chromium) on this machine: apt-get install chromium")


def rendered(page: Path) -> tuple[int, int]:
    """(plots in the page, plots the browser decoded), as the page's own check marks them after loading."""
    proc = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--dump-dom", page.absolute().as_uri()], capture_output=True, text=True, timeout=120)
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stderr[-2000:]
    plots = re.search(r'data-plots="(\d+)"', body.group(0))
    done = re.search(r'data-rendered="(\d+)"', body.group(0))
    return int(plots.group(1)), int(done.group(1)) if done else -1


def test_design_report_renders_every_plot(design, tmp_path):
    proc = galapagos("report", design, "--html", tmp_path / "r.html", "--csv", tmp_path / "r.csv", "--compare",
                     design, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {tmp_path / 'r.html'}" in proc.stdout and "ensemble (" in proc.stdout
    text = (tmp_path / "r.html").read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "<script src" not in text  # self-contained
    assert rendered(tmp_path / "r.html") == (RUN_PLOTS + ENSEMBLE_PLOTS,) * 2
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    journal = (design / "results.jsonl").read_text().splitlines()
    assert len(rows) == len(journal) == 8
    assert {"id", "status", "fitness", "params", "seconds", "genome", "metric_val_accuracy"} <= set(rows[0])


def test_ensemble_directory_report(design, tmp_path):
    proc = galapagos("report", design / "ensemble", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "ensemble" and "initial population" not in proc.stdout
    assert set(report["ensemble"]["weights"]) == set(report["ensemble"]["test"]["members"])
    proc = galapagos("report", design / "ensemble", "--html", tmp_path / "e.html", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert rendered(tmp_path / "e.html") == (ENSEMBLE_PLOTS,) * 2


def test_report_json_of_a_run_and_its_rows(design):
    from galapagos import api

    report = json.loads(galapagos("report", design, "--json", "--top", 3).stdout)
    assert report["kind"] == "design" and len(report["top"]) == 3 and report["evaluations"] == 8
    rows = api.results(design)
    assert [r["id"] for r in rows] == [json.loads(line)["id"] for line in
                                       (design / "results.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("args, words", [
    (["--html", "/no/such/dir/r.html"], "directory /no/such/dir does not exist"),
    (["--html", "r.html", "--compare", "/no/such/run"], "--compare /no/such/run: no results.jsonl"),
])
def test_report_bad_input_is_one_line(design, args, words):
    proc = galapagos("report", design, *args)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_results_as_a_data_frame(design):
    from galapagos import api
    from galapagos.errors import RunDirError

    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(RunDirError, match="a DataFrame needs pandas"):
            api.results(design, as_frame=True)
        return
    frame = api.results(design, as_frame=True)
    assert len(frame) == 8 and {"id", "status", "fitness", "metric_val_accuracy"} <= set(frame.columns)
