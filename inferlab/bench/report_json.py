"""The JSON report: every request's record and every aggregate, and how to read it back."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from inferlab.bench.metrics import DEFINITIONS, THROUGHPUT_DEFINITIONS
from inferlab.bench.records import RequestRecord
from inferlab.bench.session import RunResult
from inferlab.bench.summary import StageSummary
from inferlab.errors import InferlabError
from inferlab.user_files import read_user_text

FORMAT = "inferlab-bench/1"


def run_to_dict(result: RunResult) -> dict:
    return {
        "format": FORMAT,
        "meta": result.meta,
        "definitions": {**DEFINITIONS, **THROUGHPUT_DEFINITIONS},
        "stages": [{"spec": asdict(s.spec), "summary": s.summary.to_dict(),
                    "floor": s.floor.to_dict() if s.floor else None,
                    "requests": [r.to_dict() for r in s.records]} for s in result.stages],
        "timeline": result.timeline.to_dict(),
        "server": result.server.to_dict(),
        "slo_search": result.slo_search.to_dict() if result.slo_search else None,
        "warnings": result.warnings,
        "interrupted": result.interrupted,
    }


def write_json(result: RunResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(run_to_dict(result), separators=(",", ":")) + "\n")


@dataclass
class LoadedStage:
    label: str
    summary: StageSummary
    floor: StageSummary | None
    records: list[RequestRecord]


@dataclass
class LoadedRun:
    path: str
    meta: dict
    stages: list[LoadedStage]


def load_run(path: str | Path) -> LoadedRun:
    """Read a JSON report written by `inferlab bench --output X.json`."""
    try:
        data = json.loads(read_user_text(path))
    except json.JSONDecodeError as e:
        raise InferlabError(f"{path} is not JSON ({e.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InferlabError(f"{path} is not an inferlab bench report ({FORMAT})")
    try:
        stages = [_stage(stage) for stage in data["stages"]]
        if not stages:  # a comparison against it would pass any regression gate
            raise ValueError("it has no stages")
        return LoadedRun(str(path), data["meta"], stages)
    # a report cut short or edited by hand: a missing key, or a value of the wrong type
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        detail = f"no {e} field" if isinstance(e, KeyError) else str(e)
        raise InferlabError(f"{path} is an incomplete or damaged {FORMAT} report "
                            f"({detail})") from None


def _stage(stage: dict) -> LoadedStage:
    summary = StageSummary.from_dict(stage["summary"])
    floor = StageSummary.from_dict(stage["floor"]) if stage.get("floor") else None
    return LoadedStage(summary.info.label, summary, floor,
                       [RequestRecord.from_dict(r) for r in stage["requests"]])
