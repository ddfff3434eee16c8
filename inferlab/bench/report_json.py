"""The JSON report: every request's record and every aggregate, and how to read it back."""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from inferlab.bench.metrics import DEFINITIONS, PER_REQUEST, THROUGHPUT_DEFINITIONS
from inferlab.bench.records import OUTCOMES, RequestRecord
from inferlab.bench.session import RunResult
from inferlab.bench.summary import StageSummary
from inferlab.errors import InferlabError
from inferlab.user_files import read_user_json

FORMAT = "inferlab-bench/1"
# the Python types json.loads gives for each scalar type a report's dataclasses hint
_JSON_TYPES: dict[Any, set[type]] = {int: {int}, float: {int, float}, str: {str}, bool: {bool}}


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


def render_json(result: RunResult) -> str:
    return json.dumps(run_to_dict(result), separators=(",", ":")) + "\n"


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
    data = read_user_json(path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InferlabError(f"{path} is not an inferlab bench report ({FORMAT})")
    try:
        _check(data["meta"], dict, "meta")
        _check(data["stages"], list[dict], "stages")
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
    _check(stage["summary"], StageSummary, "summary")
    if stage.get("floor") is not None:  # a run without a floor writes null
        _check(stage["floor"], StageSummary, "floor")
    _check(stage["requests"], list[RequestRecord], "requests")
    summary = StageSummary.from_dict(stage["summary"])
    floor = StageSummary.from_dict(stage["floor"]) if stage.get("floor") else None
    return LoadedStage(summary.info.label, summary, floor,
                       [RequestRecord.from_dict(r) for r in stage["requests"]])


def _check(value: Any, hint: Any, where: str) -> None:
    """Raise KeyError or ValueError naming the first part of `value` that is not what
    the writer writes for the type `hint` (a dataclass as a dict, a list, a dict, a
    scalar): a missing field, a number that is a string, a bool or not finite, a null
    where the writer writes none. The summaries' dicts must hold every outcome and
    per-request metric too: compare and the report read them by name."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        _check_type(value, dict, where)
        for name, field_hint, plainly_fine, required in _fields(hint):
            if name in value:
                if type(value[name]) not in plainly_fine:  # the rest in full
                    _check(value[name], field_hint, f"{where}.{name}")
            elif required:
                raise KeyError(f"{where}.{name}")
    elif origin is types.UnionType:  # X | None
        if value is not None:
            _check(value, next(a for a in args if a is not type(None)), where)
    elif origin is list:
        _check_type(value, list, where)
        # scalars checked in bulk first: a report holds a timestamp per chunk
        if not (args[0] in _JSON_TYPES and set(map(type, value)) <= _JSON_TYPES[args[0]]
                and (args[0] is not float or all(map(math.isfinite, value)))):
            for i, item in enumerate(value):
                _check(item, args[0], f"{where}[{i}]")
    elif origin is dict:
        _check_type(value, dict, where)
        missing = [k for k in _required_keys(where) if k not in value]
        if missing:
            raise KeyError(f"{where}.{missing[0]}")
        for key, item in value.items():
            _check(item, args[1], f"{where}.{key}")
    else:
        _check_type(value, hint, where)


def _check_type(value: Any, hint: type, where: str) -> None:
    # exact types: JSON's true is no number, though Python's bool is an int; JSON does not
    # tell 2 from 2.0; NaN and Infinity are no statistic
    if type(value) not in _JSON_TYPES.get(hint, (hint,)) or \
            (hint is float and not math.isfinite(value)):
        raise ValueError(f"{where} is {json.dumps(value)[:40]}, not {hint.__name__}")


def _required_keys(where: str) -> tuple[str, ...]:
    if where.endswith(".counts") or ".metrics." in where:
        return OUTCOMES
    return tuple(PER_REQUEST) if where.endswith(".metrics") else ()


@cache
def _fields(cls: type) -> list[tuple[str, Any, set[type], bool]]:
    """Each field's name, type hint, the value types that fit it with no further check
    (a report has thousands of records), and whether it is required."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        union = typing.get_args(hint) if typing.get_origin(hint) is types.UnionType else (hint,)
        plain = [h for h in union if h in (int, str, bool, type(None))]  # float: NaN?
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, hint, set(plain), required))
    return out
