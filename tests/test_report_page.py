"""The interactive report in a real headless browser (Debian's chromium): every plot drawn, nothing fetched from the
network, a real mouse hover on a point showing that candidate's network, a click showing its genome, and the live
page of `report --serve` showing an evaluation that finished after the page was opened.

The run directory here is written with the journal's own writer (RunDir.append), from genomes and numbers made up
for the test, so that these tests need neither MPI nor training; tests/test_html_report.py does the same on a real
design run. The browser is driven over the DevTools protocol on a pipe (--remote-debugging-pipe), with the standard
library only."""
from __future__ import annotations

import fcntl
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from galapagos.evolve.genome import Genome
from galapagos.reports import tables
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]
RUN_PLOTS = 9  # evaluations, curves, size, latency, importance, parallel coordinates, timeline, genealogy, status


def browser_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    pytest.skip("no headless browser (chromium) on this machine: apt-get install chromium")


def record(i: int, t0: float, rng: random.Random, *, end: float | None = None) -> JournalRecord:
    """Evaluation `i` of a made-up run whose fitness is decided by lr (so lr is the most important parameter)."""
    lr = rng.choice([1e-4, 1e-3, 1e-2])
    genome = Genome(layers=[{"type": "conv", "channels": rng.choice([8, 16]), "kernel": 3, "stride": 1, "act": "relu"},
                            {"type": "pool", "op": "max", "size": 2},
                            {"type": "dense", "units": rng.choice([16, 32]), "act": "gelu"}],
                    optimizer=rng.choice(["adam", "sgd"]), lr=lr, batch_size=rng.choice([32, 64]))
    fitness = {1e-4: 0.5, 1e-3: 0.9, 1e-2: 0.7}[lr] + rng.uniform(-0.02, 0.02)
    status = "failed" if i == 7 else "pruned" if i % 5 == 4 else "ok"
    epochs = 2 if status == "pruned" else 4
    curve = [fitness * (0.7 + 0.1 * e) for e in range(epochs)]
    start = t0 + 10 * i if end is None else end - 8
    return JournalRecord(id=i, genome=genome, status=status, fitness=None if status == "failed" else curve[-1],
                         metrics={"val_accuracy": curve[-1], "latency_ms": 0.1 + 0.01 * i} if status == "ok" else {},
                         curve=[] if status == "failed" else curve, key=genome.key, params=1000 + 100 * i,
                         origin="random" if i < 4 else "mutation", rank=1 + i % 3, host="node1", start=start,
                         end=start + 8 if end is None else end, parents=[] if i < 4 else [i - 4],
                         error="RuntimeError: boom\n" if status == "failed" else None)


def make_run(path: Path, n: int = 24) -> Path:
    """A run directory whose journal holds `n` evaluations, written as the master writes it."""
    path.mkdir(parents=True)
    run, rng, t0 = RunDir(path), random.Random(0), time.time() - 3600
    for i in range(n):
        run.append(record(i, t0, rng))
    run.close()
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("page") / "run")


def cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "galapagos.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def dumped(page: Path) -> dict[str, str]:
    """The <body> marks of a page after its scripts ran in headless chromium (--dump-dom)."""
    proc = subprocess.run([browser_path(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--dump-dom", page.absolute().as_uri()], capture_output=True, text=True, timeout=120)
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, proc.stderr[-2000:]
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', body.group(0)))


class Browser:
    """Headless chromium over the DevTools protocol on a pipe: commands go to its fd 3, answers and events come
    from its fd 4, each one JSON message ending in a NUL byte."""

    def __init__(self):
        to_read, self._to = os.pipe()
        self._from, to_write = os.pipe()

        def fds() -> None:  # in the child: the pipes as fds 3 and 4 (moved above 10 first, so none is overwritten)
            a, b = fcntl.fcntl(to_read, fcntl.F_DUPFD, 10), fcntl.fcntl(to_write, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([browser_path(), "--headless", "--no-sandbox", "--disable-gpu",
                                      "--remote-debugging-pipe", "--window-size=1400,1000", "about:blank"],
                                     close_fds=False, preexec_fn=fds, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_read)
        os.close(to_write)
        self.buffer, self.count, self.events = b"", 0, []
        page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        for domain in ("Network", "Page", "Runtime"):
            self.call(f"{domain}.enable", self.session)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self.count += 1
        message = {"id": self.count, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._to, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self._from, 1 << 16)
                assert chunk, "the browser closed its pipe"
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") != self.count:
                self.events.append(answer)
                continue
            assert "error" not in answer, answer["error"]
            return answer["result"]

    def open(self, url: str) -> None:
        self.call("Page.navigate", self.session, url=url)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", self.session, expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait(self, expression: str, seconds: float = 30):
        """The value of `expression` once it is truthy (polled)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if value := self.js(expression):
                return value
            time.sleep(0.2)
        raise AssertionError(f"not true after {seconds} s: {expression}")

    def mouse(self, kind: str, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", self.session, type=kind, x=x, y=y, button="left",
                  clickCount=0 if kind == "mouseMoved" else 1)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to)
        os.close(self._from)


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


# Where on the screen the first point of the evaluations plot is (its SVG element's centre, scrolled into view).
FIRST_POINT = """(() => { const d = document.getElementById("plot-evaluations"); d.scrollIntoView();
  const r = d.querySelector(".scatterlayer .trace .point").getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2]; })()"""


def test_every_plot_renders_and_nothing_is_fetched(run, tmp_path, browser):
    out = tmp_path / "r.html"
    proc = cli("report", run, "--html", out)
    assert proc.returncode == 0, proc.stderr
    marks = dumped(out)
    assert (marks["plots"], marks["rendered"], marks["evaluations"]) == (str(RUN_PLOTS), str(RUN_PLOTS), "24")
    browser.open(out.absolute().as_uri())
    assert browser.wait("document.body.dataset.rendered") == str(RUN_PLOTS)
    urls = [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
    assert urls and all(u.startswith(("file:", "data:", "about:")) for u in urls), urls
    errors = [e["params"] for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    assert not errors, errors


def test_hovering_a_point_shows_its_network_and_clicking_shows_its_genome(run, tmp_path, browser):
    out = tmp_path / "r.html"
    assert cli("report", run, "--html", out).returncode == 0
    browser.open(out.absolute().as_uri())
    browser.wait("document.body.dataset.rendered")
    x, y = browser.js(FIRST_POINT)
    browser.mouse("mouseMoved", x, y)
    label = browser.wait('(document.querySelector("#plot-evaluations .hovertext") || {}).textContent')
    shown = int(re.match(r"#(\d+) ", label).group(1))
    network = next(r["genome"] for r in tables.rows(run) if r["id"] == shown)
    assert network.replace(" | ", "") in label and "fitness" in label  # the label puts " | " on a new line
    browser.mouse("mousePressed", x, y)
    browser.mouse("mouseReleased", x, y)
    assert browser.wait("document.body.dataset.picked") == str(shown)
    panel = browser.js('document.getElementById("selected").textContent')
    genome = Genome.from_json(next(r for r in map(json.loads, (run / "results.jsonl").read_text().splitlines())
                                   if r["id"] == shown)["genome"])
    assert f"#{shown}" in panel and f'"lr": {genome.lr}' in panel and '"layers"' in panel
    assert browser.js(f'document.getElementById("row-{shown}").classList.contains("picked")')


def test_the_table_sorts_by_a_column(run, tmp_path, browser):
    out = tmp_path / "r.html"
    assert cli("report", run, "--html", out).returncode == 0
    browser.open(out.absolute().as_uri())
    browser.wait("document.body.dataset.rendered")
    ids = 'Array.from(document.querySelectorAll("#evaluations tbody tr")).map(r => +r.dataset.id)'
    assert browser.js(ids) == list(range(24))
    browser.js('document.querySelector("#evaluations th[data-col=\\"2\\"]").click()')  # fitness, ascending
    fitness = {r["id"]: r["fitness"] for r in tables.rows(run)}
    order = [i for i in browser.js(ids) if fitness[i] is not None]
    assert order == sorted(order, key=lambda i: fitness[i]) and browser.js(ids)[-1] == 7  # the failed one last


def test_the_live_page_shows_an_evaluation_that_finished_after_it_opened(tmp_path, browser):
    run = make_run(tmp_path / "run", n=12)
    server = subprocess.Popen([sys.executable, "-m", "galapagos.cli", "report", run, "--serve", "--port", "0"],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line + server.stderr.read() if server.poll() is not None else line
        browser.open(url.group(0))
        assert browser.wait("document.body.dataset.evaluations") == "12"
        assert "live" in browser.js('document.getElementById("made").textContent')
        journal = RunDir(run)  # the master's own writer, as a running search appends
        journal.append(record(12, 0.0, random.Random(1), end=time.time()))
        journal.close()
        assert browser.wait('document.body.dataset.evaluations === "13" && document.getElementById("row-12") '
                            '&& document.body.dataset.rendered')
        points = browser.js('document.getElementById("plot-evaluations").data.filter(t => t.mode === "markers")'
                            '.reduce((n, t) => n + t.customdata.length, 0)')
        assert points == 12  # 13 evaluations, one of them failed (no fitness to plot)
        assert not [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
        server.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = server.communicate(timeout=120)  # as cli(): a loaded machine is slow
        assert server.returncode == 0 and "Traceback" not in err, err
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()


def test_serve_refuses_a_directory_that_is_not_a_run(tmp_path):
    proc = cli("report", tmp_path, "--serve", "--port", "0")
    assert proc.returncode == 2 and "not a run, design or ensemble directory" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
