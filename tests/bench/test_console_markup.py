"""User text in the run summary (model names, URLs, server errors, file names) is printed
as written: rich markup in it neither crashes the summary nor loses its brackets."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from inferlab.bench.console import print_summary
from inferlab.bench.server_metrics import ServerTimeline
from inferlab.bench.session import RunResult
from inferlab.bench.timeline import build_timeline
from inferlab.cli import main

REJECTION = "prompt rejected by filter [/etc/policy]"
ODD_MODEL = "<script>x</script>[/]x[bold"


def summary_text(model: str, notes: list[str], warnings: list[str]) -> str:
    meta = {"model": model, "target": "http://127.0.0.1:8000/[b]gw", "profile": "constant",
            "notes": notes}
    result = RunResult(meta, [], build_timeline([], 0), ServerTimeline(False, ""),
                       warnings=warnings)
    out = io.StringIO()
    print_summary(result, Console(file=out, width=300, color_system=None))
    return out.getvalue()


@pytest.mark.parametrize("model", ["mistral[awq]", ODD_MODEL, "[bold]x[/bold]", "trailing\\"])
def test_the_model_and_target_are_printed_as_written(model):
    text = summary_text(model, [], [])
    assert f"{model} at http://127.0.0.1:8000/[b]gw (constant): load" in text


def test_notes_and_warnings_are_printed_as_written():
    warning = f"constant@5/s: 5 of 5 requests failed; the first: HTTP 400: {REJECTION}"
    note = "prompts cut from /data/[red]corpus[/].txt"
    text = summary_text("m", [note], [warning, "ends in a backslash\\"])
    assert f"warning: {warning}" in text
    assert f"note: {note}" in text
    assert "warning: ends in a backslash\\" in text


class _Rejecting(BaseHTTPRequestHandler):
    """A server that lists one model and rejects every prompt with a bracketed reason."""

    protocol_version = "HTTP/1.1"

    def _send(self, code: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (the http.server hook's name)
        self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(400, {"error": {"message": REJECTION, "type": "BadRequestError"}})

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the bench's output, not this server's access log."""


@pytest.fixture
def rejecting_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Rejecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def bench_argv(url: str, corpus: Path, tmp_path: Path) -> list[str]:
    return ["bench", "--target", url, "--profile", "constant", "--rate", "5",
            "--max-seconds", "1", "--data", "prompt_tokens=8,output_tokens=2",
            "--data-file", str(corpus),
            "--calibration-seconds", "0", "--scrape-interval", "0", "--workers", "1",
            "--quiet", "--output", str(tmp_path / "run.json")]


def test_a_server_error_with_brackets_is_reported_not_a_crash(rejecting_server, corpus,
                                                               tmp_path, capsys):
    assert main(bench_argv(rejecting_server, corpus, tmp_path)) == 1  # every request failed
    captured = capsys.readouterr()
    assert f"the first: HTTP 400: {REJECTION}" in captured.out
    assert f"the first: HTTP 400: {REJECTION}\n" in captured.err


def test_a_model_named_in_markup_is_reported_not_a_crash(mock_server, corpus, tmp_path,
                                                         capsys):
    url = mock_server(model=ODD_MODEL, itl_ms=1)
    assert main(bench_argv(url, corpus, tmp_path)) == 0
    assert f"{ODD_MODEL} at {url} (constant): load" in capsys.readouterr().out
