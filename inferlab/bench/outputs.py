"""Write a run's report in every format asked for, by file extension."""

from __future__ import annotations

from pathlib import Path

from inferlab.bench.config import REPORT_SUFFIXES
from inferlab.bench.report_csv import render_csv
from inferlab.bench.report_html import render as render_html
from inferlab.bench.report_json import render_json
from inferlab.bench.session import RunResult
from inferlab.user_files import check_writable, write_user_text

RENDERERS = dict(zip(REPORT_SUFFIXES, (render_json, render_csv, render_html), strict=True))


def check_output_paths(paths: tuple[str, ...]) -> None:
    """BenchConfig has checked their suffixes."""
    for path in paths:
        check_writable(path, "--output")


def write_report(path: str, text: str, flag: str = "--output") -> str | None:
    """Write one report; the one-line error when it cannot be (a full disk after the run), the
    cut-off file removed, so that the caller still writes the others and shows the results."""
    try:
        write_user_text(path, text)
    except OSError as e:
        return f"{flag} {path}: cannot write ({e.strerror})"
    return None


def write_outputs(result: RunResult, paths: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """Each path with the error that kept its report from being written, or None."""
    return [(path, write_report(path, RENDERERS[Path(path).suffix](result))) for path in paths]
