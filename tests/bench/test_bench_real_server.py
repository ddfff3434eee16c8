"""End to end: `inferlab serve` with the embedded model, a short sweep against it, and the
JSON, CSV and HTML reports it writes (the HTML opened in Chromium when it is installed)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("inferlab.server", reason="the inferlab server is not built yet")

SERVER_START_TIMEOUT_S = 120


def _read_until_url(proc: subprocess.Popen, found: list[str], ready: threading.Event) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        if not found and " at http://" in line:
            found.append(line.split(" at ", 1)[1].split()[0])
            ready.set()
    ready.set()  # stdout closed: the server exited


@pytest.fixture(scope="module")
def inferlab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # stderr to a file: the server's access log must never fill a pipe nobody reads
    log_path = tmp_path_factory.mktemp("server") / "stderr.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        # 256 MiB of KV cache: committing the CPU default of 2 GiB took ~20 s here
        [sys.executable, "-m", "inferlab.cli", "serve", "--port", "0", "--max-model-len",
         "1024", "--kv-cache-memory", "256MiB"], stdout=subprocess.PIPE, stderr=log, text=True)
    found: list[str] = []
    ready = threading.Event()
    threading.Thread(target=_read_until_url, args=(proc, found, ready), daemon=True).start()
    try:
        ready.wait(SERVER_START_TIMEOUT_S)
        if not found:
            proc.kill()
            proc.wait()
            err = log_path.read_text()[-2000:]
            if "ModelLoadError" in err or "not available" in err:
                pytest.skip(f"the embedded model is not available: {err[-300:]}")
            pytest.fail(f"inferlab serve printed no URL within {SERVER_START_TIMEOUT_S} s: "
                        f"{err}")
        url = found[0]
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{url}/health was not 200 within {SERVER_START_TIMEOUT_S} s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_short_sweep_against_the_embedded_model(inferlab_server, corpus, tmp_path):
    outputs = {ext: tmp_path / f"sweep.{ext}" for ext in ("json", "csv", "html")}
    argv = [sys.executable, "-m", "inferlab.cli", "bench", "--target", inferlab_server,
            # stages end by count, not time: on a loaded machine 3 s once held no finished
            # request, and a 0 req/s stage leaves the sweep no rates to run
            "--profile", "sweep", "--sweep-size", "3", "--max-requests", "6",
            "--max-seconds", "30", "--sweep-sync-seconds", "30", "--max-concurrency", "4",
            "--drain-seconds", "8",
            "--data", "prompt_tokens=32,output_tokens=8", "--data-file", str(corpus),
            "--calibration-seconds", "0.5", "--scrape-interval", "0.5", "--quiet"]
    for path in outputs.values():
        argv += ["--output", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(outputs["json"].read_text())
    kinds = [s["spec"]["kind"] for s in report["stages"]]
    assert kinds == ["synchronous", "throughput", "constant"]
    for stage in report["stages"]:
        summary = stage["summary"]
        assert summary["counts"]["ok"] >= 1 and summary["counts"]["error"] == 0
        ok = [r for r in stage["requests"] if r["outcome"] == "ok"]
        # the server's usage says how long each output was; ignore_eos made it 8
        assert {(r["output_tokens"], r["output_tokens_source"]) for r in ok} == {(8, "usage")}
        assert all(r["first_token_ns"] > r["start_ns"] for r in ok)
        assert stage["floor"] is not None
    server = report["server"]
    assert server["available"], server["note"]
    assert max(v for v in server["series"]["running"] if v is not None) >= 1
    # every prompt starts with a unique tag: no block of one request is another's prefix
    assert server["series"]["prefix_cache_hits"][-1] == 0
    with outputs["csv"].open() as f:
        assert [row["kind"] for row in csv.DictReader(f)] == kinds
    html = outputs["html"].read_text()
    assert "Latency vs throughput" in html and "Server queue" in html
    from bench_browser import CHROMIUM, load_page, screenshot

    if CHROMIUM.exists():
        _, messages = load_page(outputs["html"])
        assert messages == []
        assert screenshot(outputs["html"], tmp_path / "sweep.png") == []
