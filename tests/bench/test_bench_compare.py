"""`bench compare`: the significance test on known values, and a regression gate that
catches a mock server made slower."""

from __future__ import annotations

import pytest
from bench_helpers import bench_config, closed_stdout_exit_code, run

from inferlab.bench.outputs import write_outputs
from inferlab.bench.report_json import load_run
from inferlab.cli import main
from inferlab.errors import InferlabError


def bench_to_json(url: str, corpus, path) -> str:
    config = bench_config(url, corpus, "concurrent", (4,), max_seconds=1.5,
                          data="prompt_tokens=16,output_tokens=8")
    write_outputs(run(config), (str(path),))
    return str(path)


def test_compare_flags_a_slowed_server(mock_server, corpus, tmp_path, capsys):
    base = bench_to_json(mock_server(ttft_ms=40, itl_ms=4), corpus, tmp_path / "base.json")
    slow = bench_to_json(mock_server(ttft_ms=80, itl_ms=4), corpus, tmp_path / "slow.json")
    html = tmp_path / "compare.html"
    code = main(["bench", "compare", base, slow, "--fail-on-regression", "20",
                 "--output", str(html)])
    out = capsys.readouterr().out
    assert code == 1
    assert "regression: concurrent@4 ttft_ms median" in out
    assert "itl_ms median" not in out.split("regression:", 1)[1]  # ITL did not change
    assert "<svg" in html.read_text() and "bootstrap of the difference" in html.read_text()
    # the same run against itself passes the gate
    assert main(["bench", "compare", base, base, "--fail-on-regression", "20"]) == 0
    # a reader of the table that left (`| head`) changes no verdict
    assert closed_stdout_exit_code(["bench", "compare", base, slow, "--fail-on-regression", "20"]) == 1
    loaded = load_run(base)
    assert loaded.stages[0].label == "concurrent@4" and loaded.stages[0].records


def test_compare_rejects_what_is_not_a_report(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(InferlabError, match="not an inferlab bench report"):
        load_run(bad)
    assert main(["bench", "compare", str(bad), str(bad)]) == 2
