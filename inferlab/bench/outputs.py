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
        parent = Path(path).parent
        if not parent.is_dir():
            raise InferlabError(f"--output {path}: folder {parent} does not exist")


def write_outputs(result: RunResult, paths: tuple[str, ...]) -> list[str]:
    check_output_paths(paths)
    for path in paths:
        WRITERS[Path(path).suffix](result, path)
    return list(paths)
