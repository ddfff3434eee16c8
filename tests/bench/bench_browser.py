"""Headless Chromium for the HTML report tests: console messages, DOM and a screenshot."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # every host resolves nowhere: a page that fetched anything would show it
         "--host-resolver-rules=MAP * ~NOTFOUND"]


def require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")


def _chromium(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
             "--v=0", *extra, page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False)


def console_messages(stderr: str) -> list[str]:
    """What the page logged or threw (Chromium prints these as CONSOLE lines)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def load_page(page: Path) -> tuple[str, list[str]]:
    """The DOM after the page's scripts ran, and its console messages."""
    done = _chromium(page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, console_messages(done.stderr)


def screenshot(page: Path, out: Path) -> list[str]:
    done = _chromium(page, f"--screenshot={out}", "--window-size=1400,2400",
                     "--hide-scrollbars")
    assert done.returncode == 0 and out.is_file(), done.stderr[-2000:]
    return console_messages(done.stderr)
