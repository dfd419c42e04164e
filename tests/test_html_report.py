"""`report --html/--csv/--json` on a real design run: its report opened in a real headless browser (every plot
drawn, the ensemble's diversity among them), the ensemble directory's own report, another run beside it, the journal
as a flat table. tests/test_report_page.py checks hover, click and the live page on a journal made for the test."""
from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - fixture
from tests.test_report_page import browser_path

pytestmark = pytest.mark.mpi
RUN_PLOTS = {"evaluations", "curves", "cost-params", "timeline", "genealogy", "status"}  # and more where data allows
ENSEMBLE_PLOTS = {"weights", "members", "diversity", "calibration", "uncertainty"}


@pytest.fixture(scope="module")
def design(shapes_file, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("html") / "design"
    proc = galapagos("design", "--data", shapes_file, "--out", out, "--evaluations", 8, "--workers", 2, "--members",
                     2, *SMALL, "--set", "ensemble.epochs=1", timeout=400)
    assert proc.returncode == 0, proc.stderr
    return out


def rendered(page: Path) -> tuple[int, int, set[str]]:
    """(plots in the page, plots plotly drew, their names), as the page marks them once its scripts ran."""
    proc = subprocess.run([browser_path(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--dump-dom", page.absolute().as_uri()], capture_output=True, text=True, timeout=120)
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stderr[-2000:]
    plots = re.search(r'data-plots="(\d+)"', body.group(0))
    done = re.search(r'data-rendered="(\d+)"', body.group(0))
    return int(plots.group(1)), int(done.group(1)) if done else -1, set(re.findall(r'id="plot-([a-z-]+)"', proc.stdout))


def test_design_report_renders_every_plot(design, tmp_path):
    proc = galapagos("report", design, "--html", tmp_path / "r.html", "--csv", tmp_path / "r.csv", "--compare",
                     design, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {tmp_path / 'r.html'}" in proc.stdout and "ensemble (" in proc.stdout
    text = (tmp_path / "r.html").read_text()
    assert not re.search(r"""<(script|link|img)[^>]+(src|href)=["']?https?:""", text)  # self-contained
    plots, drawn, names = rendered(tmp_path / "r.html")
    assert plots == drawn and RUN_PLOTS | ENSEMBLE_PLOTS <= names, names
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    journal = (design / "results.jsonl").read_text().splitlines()
    assert len(rows) == len(journal) == 8
    assert {"id", "status", "fitness", "params", "seconds", "genome", "metric_val_accuracy", "params_lr",
            "params_layers"} <= set(rows[0]) and rows[0]["start"].endswith("Z")


def test_ensemble_directory_report(design, tmp_path):
    proc = galapagos("report", design / "ensemble", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "ensemble" and "initial population" not in proc.stdout
    assert set(report["ensemble"]["weights"]) == set(report["ensemble"]["test"]["members"])
    proc = galapagos("report", design / "ensemble", "--html", tmp_path / "e.html", timeout=300)
    assert proc.returncode == 0, proc.stderr
    plots, drawn, names = rendered(tmp_path / "e.html")
    assert plots == drawn and names == ENSEMBLE_PLOTS, names


def test_report_json_of_a_run_and_its_rows(design):
    from galapagos import api

    report = json.loads(galapagos("report", design, "--json", "--top", 3).stdout)
    assert report["kind"] == "design" and len(report["top"]) == 3 and report["evaluations"] == 8
    assert isinstance(report["best"]["genome"]["layers"], list) and report["top"][0]["genome"]["lr"] > 0
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
