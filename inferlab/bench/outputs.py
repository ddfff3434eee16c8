"""Write a run's report in every format asked for, by file extension."""

from __future__ import annotations

from pathlib import Path

from inferlab.bench.report_csv import write_csv
from inferlab.bench.report_html import write_html
from inferlab.bench.report_json import write_json
from inferlab.bench.session import RunResult
from inferlab.errors import InferlabError

WRITERS = {".json": write_json, ".csv": write_csv, ".html": write_html}


def check_output_paths(paths: tuple[str, ...]) -> None:
    for path in paths:
        if Path(path).suffix not in WRITERS:
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


def write_outputs(result: RunResult, paths: tuple[str, ...]) -> list[str]:
    check_output_paths(paths)
    for path in paths:
        WRITERS[Path(path).suffix](result, path)
    return list(paths)
