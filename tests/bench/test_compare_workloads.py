"""`bench compare` across two runs: refused when they asked different workloads (unless
allowed, then warned), allowed across servers and models, and user strings (paths, labels)
printed as they are, never read as console markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import synthetic_stage as stage
from rich.console import Console

from inferlab.bench.compare import compare
from inferlab.bench.compare_report import print_comparison, render_comparison_html
from inferlab.bench.report_json import FORMAT, LoadedStage, load_run
from inferlab.cli import main
from inferlab.errors import InferlabError

META = {"target": "http://127.0.0.1:18480", "model": "m", "endpoint": "completions",
        "profile": "constant", "data": "synthetic prompt_tokens=16,output_tokens=8 cut from c.txt",
        "slo": None}
TTFTS = [20.0 + i % 7 for i in range(60)]


def write_report(path: Path, *stages: LoadedStage, **meta: object) -> str:
    """A JSON report as `inferlab bench --output` writes it, of what compare reads."""
    data = {"format": FORMAT, "meta": {**META, **meta},
            "stages": [{"spec": {}, "summary": s.summary.to_dict(), "floor": None,
                        "requests": [r.to_dict() for r in s.records]} for s in stages]}
    path.write_text(json.dumps(data))
    return str(path)


def refusal(tmp_path: Path, capsys, base: tuple, other: tuple) -> str:
    """Exit 2 and its one-line message, for base and other given as (stages, meta)."""
    a = write_report(tmp_path / "a.json", *base[0], **base[1])
    b = write_report(tmp_path / "b.json", *other[0], **other[1])
    assert main(["bench", "compare", a, b, "--fail-on-regression", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_runs_at_different_rates_are_refused(tmp_path, capsys):
    # 10 req/s against 5: pairing by position would report the throughput halved
    err = refusal(tmp_path, capsys, ([stage(TTFTS, label="constant@10/s")], {}),
                  ([stage(TTFTS, label="constant@5/s")], {}))
    assert "different workloads" in err and "constant@10/s vs constant@5/s" in err
    assert "--allow-different-workloads" in err


def test_runs_of_different_data_or_slo_are_refused(tmp_path, capsys):
    err = refusal(tmp_path, capsys, ([stage(TTFTS)], {}),
                  ([stage(TTFTS)], {"data": "synthetic prompt_tokens=64,output_tokens=2"}))
    assert "prompt_tokens=16,output_tokens=8" in err and "prompt_tokens=64,output_tokens=2" in err
    # goodput counts the requests within the SLO: two SLOs, two goodputs
    err = refusal(tmp_path, capsys, ([stage(TTFTS)], {"slo": {"ttft_ms": 100}}),
                  ([stage(TTFTS)], {"slo": {"ttft_ms": 50}}))
    assert "slo" in err


def test_another_server_or_model_is_what_compare_is_for(tmp_path):
    a = write_report(tmp_path / "a.json", stage(TTFTS))
    b = write_report(tmp_path / "b.json", stage(TTFTS), target="http://10.0.0.2:8000",
                     model="other-model")
    assert main(["bench", "compare", a, b, "--fail-on-regression", "5"]) == 0


def test_a_sweeps_measured_rates_are_not_asked_ones(tmp_path):
    # a sweep picks its constant rates from what the server measured: they differ by server
    a = write_report(tmp_path / "a.json", stage(TTFTS, label="constant@12.5/s"), profile="sweep")
    b = write_report(tmp_path / "b.json", stage(TTFTS, label="constant@17.25/s"), profile="sweep")
    assert not compare(load_run(a), load_run(b)).warnings
    c = write_report(tmp_path / "c.json", stage(TTFTS, label="constant@17.25/s"))
    with pytest.raises(InferlabError, match="profile 'sweep' vs 'constant'"):
        compare(load_run(a), load_run(c))


def test_different_workloads_compared_on_purpose_are_warned_about(tmp_path):
    a = load_run(write_report(tmp_path / "a.json", stage(TTFTS, label="constant@10/s")))
    b = load_run(write_report(tmp_path / "b.json", stage(TTFTS, label="constant@5/s")))
    comparison = compare(a, b, allow_different_workloads=True)
    assert len(comparison.warnings) == 1 and "constant@10/s vs constant@5/s" in \
        comparison.warnings[0]
    console = Console(record=True, width=300)
    print_comparison(comparison, console, 0.05)
    first = console.export_text().splitlines()[0]
    assert first.startswith("warning: ") and "constant@10/s vs constant@5/s" in first
    assert "constant@10/s vs constant@5/s" in render_comparison_html([comparison], 0.05, [])


def test_the_cli_flag_compares_different_workloads_with_a_warning(tmp_path, capsys):
    a = write_report(tmp_path / "a.json", stage(TTFTS, label="constant@10/s"))
    b = write_report(tmp_path / "b.json", stage(TTFTS, label="constant@5/s"))
    assert main(["bench", "compare", a, b, "--allow-different-workloads"]) == 0
    assert "warning: " in capsys.readouterr().out


@pytest.mark.parametrize("name", ["runs[/]base.json", "[old]base.json", "a[bold]b\\.json"])
def test_paths_and_labels_print_as_they_are(tmp_path, name):
    base = load_run(write_report(tmp_path / "a.json", stage(TTFTS, label="[red]x")))
    other = load_run(write_report(tmp_path / "b.json", stage(TTFTS, label="[red]x"),
                                  data="[i]other data"))
    # as given on the command line (short: a title wider than the table wraps)
    base.path, other.path = name, "b.json"
    console = Console(record=True, width=300)
    print_comparison(compare(base, other, allow_different_workloads=True), console, 0.05)
    text = console.export_text()
    assert f"{name} -> {other.path}" in text and "│ [red]x " in text
    assert "'[i]other data'" in text
