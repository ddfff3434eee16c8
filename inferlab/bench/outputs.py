"""Write a run's report in every format asked for, by file extension."""

from __future__ import annotations

from pathlib import Path

from inferlab.bench.report_csv import render_csv
from inferlab.bench.report_html import render as render_html
from inferlab.bench.report_json import render_json
from inferlab.bench.session import RunResult
from inferlab.errors import InferlabError
from inferlab.user_files import write_user_text

RENDERERS = {".json": render_json, ".csv": render_csv, ".html": render_html}


def check_output_paths(paths: tuple[str, ...]) -> None:
    for path in paths:
        if Path(path).suffix not in RENDERERS:
            raise InferlabError(f"--output {path}: use a .json, .csv or .html name")
        check_writable(path, "--output")


def check_writable(path: str, flag: str) -> None:
    """Open `path` as its writer will, now: a missing folder, a folder of that name or a
    place that takes no files fails before the work, not after it with the result lost."""
    target = Path(path)
    if not target.parent.is_dir():
        raise InferlabError(f"{flag} {path}: folder {target.parent} does not exist")
    existed = target.exists()
    try:
        target.open("a").close()  # append: an existing file keeps its content until written
    except OSError as e:
        raise InferlabError(f"{flag} {path}: cannot write ({e.strerror})") from None
    if not existed:
        target.unlink()  # nothing left behind if the work then fails


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
