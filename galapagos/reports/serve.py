"""`report --serve`: the HTML report of a run, live, on 127.0.0.1, so a running search can be watched from a
browser (on a cluster: `ssh -L 8050:127.0.0.1:8050 login-node`, then http://127.0.0.1:8050/ on the laptop).

The Python standard library's http.server, no web framework: `/` is the report's page (galapagos/reports/html.py)
and `/live.json` the run's data as it stands, which the page polls every two seconds and redraws from when the
journal has grown. The server only reads the run directory; the ensemble's section (it predicts on the data file)
is made once, on the first page load.
"""
from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from galapagos.errors import RunDirError, UsageError
from galapagos.reports import html
from galapagos.store.ensembledir import is_ensemble
from galapagos.store.rundir import JournalDir, RunDir

log = logging.getLogger(__name__)
DATA = "live.json"  # the page polls it (not the run directory's data.json)


class Report:
    """The page and its data for one directory; the data remade only when the journal has grown (a stat, not a
    second read of the whole journal per poll)."""

    def __init__(self, path: str | Path, compare: str | Path | None = None):
        self.path, self.compare, self.lock = Path(path), compare, threading.Lock()
        self.journal = JournalDir(path).journal
        self.data: dict | None = None
        self.seen = -1  # the journal's size when `data` was made
        self.ensemble: dict | None = None

    def current(self) -> dict:
        with self.lock:
            size = self.journal.stat().st_size if self.journal.exists() else 0
            if self.data is None or self.seen != size or self.data["kind"] == "ensemble":
                self.data, self.seen = html.payload(self.path, self.compare, ensemble=False), size
            return self.data

    def page(self) -> str:
        data = dict(self.current())
        with self.lock:
            if self.ensemble is None:
                self.ensemble = html.payload(self.path, ensemble=True).get("ensemble") or {}
        if self.ensemble:
            data["ensemble"] = self.ensemble
            data["kind"] = "ensemble" if data["kind"] == "ensemble" else "design"
        return html.page(data, live=DATA)


def handler(report: Report) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            where = self.path.split("?")[0]
            try:
                if where in ("/", "/index.html"):
                    self.send("text/html; charset=utf-8", report.page().encode())
                elif where == "/" + DATA:
                    self.send("application/json", json.dumps(report.current(), allow_nan=False, default=str).encode())
                else:
                    self.send_error(404, "only / and /live.json are served here")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the browser went away mid-answer
            except Exception as exc:  # noqa: BLE001 - a journal line being repaired or the like: say so, keep serving
                log.warning("report --serve: %s: %s", type(exc).__name__, exc)
                self.send_error(500, f"{type(exc).__name__}: {exc}")

        def send(self, kind: str, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            log.debug("report --serve: " + format, *args)

    return Handler


def open_server(path: str | Path, port: int = 8050, compare: str | Path | None = None) -> ThreadingHTTPServer:
    """A server of `path`'s report on 127.0.0.1:`port` (0: a free port; server.server_address says which)."""
    run = RunDir(path)
    if not (run.journal.exists() or run.config.exists() or is_ensemble(path)):
        raise RunDirError(f"{path}: no {run.journal.name} or {run.config.name} (not a run, design or ensemble "
                          "directory)")
    if compare and not RunDir(compare).journal.exists():
        raise RunDirError(f"--compare {compare}: no {RunDir(compare).journal.name} (not a run directory)")
    report = Report(path, compare)
    report.current()  # a directory that cannot be read fails here, before anything listens
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler(report))
    except OSError as exc:
        raise UsageError(f"--port {port}: cannot listen on 127.0.0.1:{port} ({exc.strerror}); pick another port, "
                         "or --port 0 for any free one") from None
    server.daemon_threads = True
    return server


def serve(path: str | Path, port: int = 8050, compare: str | Path | None = None, announce=print) -> None:
    """Serve until Ctrl-C (or SIGTERM, as KeyboardInterrupt from the CLI); `announce` gets the URL line."""
    server = open_server(path, port, compare)
    host, port = server.server_address[:2]
    announce(f"serving the report of {path} on http://{host}:{port}/ (refreshes as the run goes on; Ctrl-C stops)")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
