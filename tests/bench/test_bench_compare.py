"""`bench compare`: the significance test on known values, and a regression gate that
catches a mock server made slower."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bench_helpers import bench_config, closed_stdout_exit_code, run

from inferlab.bench.outputs import write_outputs
from inferlab.bench.report_json import load_run
from inferlab.bench.significance import average_ranks, mann_whitney_u
from inferlab.cli import main
from inferlab.errors import InferlabError


def test_mann_whitney_on_small_separated_samples_is_exact():
    # x entirely below y: U = 0, one of the C(6, 3) = 20 orderings, so two-sided p = 2 / 20
    # (the normal approximation said 0.08086)
    u, p = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert u == 0 and p == pytest.approx(0.1)
    # U = 1 for [1, 2, 4] | [3, 5, 6]: orderings with U <= 1 are 2 of 20 -> p = 4 / 20
    assert mann_whitney_u([1, 2, 4], [3, 5, 6]) == (1.0, pytest.approx(0.2))
    # 2 against 3 with U = 3 of 6: the middle, p capped at 1
    assert mann_whitney_u([2, 4], [1, 3, 5])[1] == 1.0


def test_mann_whitney_on_larger_separated_samples():
    # 9 against 9, x entirely below y: U = 0; normal approximation with continuity correction:
    # z = (40.5 - 0.5) / sqrt(81 * 19 / 12) = 3.5321, two-sided p = 4.123e-4
    u, p = mann_whitney_u(list(range(9)), list(range(10, 19)))
    assert u == 0 and p == pytest.approx(4.123e-4, rel=1e-3)


def test_mann_whitney_with_ties():
    # ranks of [1, 2, 2, 3 | 2, 3, 4, 5]: 1, 3, 3, 5.5 | 3, 5.5, 7, 8 -> R1 = 12.5, U = 2.5
    # tie groups of 3 (value 2) and 2 (value 3): correction (24 + 6) / (8 * 7) = 0.5357
    # var = 16 / 12 * (9 - 0.5357) = 11.286; z = (8 - 2.5 - 0.5) / 3.3594 = 1.4884
    u, p = mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 5])
    assert u == 2.5 and p == pytest.approx(0.13665, abs=1e-4)
    ranks, ties = average_ranks(np.array([1, 2, 2, 3, 2, 3, 4, 5]))
    assert list(ranks) == [1, 3, 3, 5.5, 3, 5.5, 7, 8] and sorted(ties) == [1, 1, 1, 2, 3]


def test_mann_whitney_degenerate_cases():
    assert mann_whitney_u([2, 2], [2, 2]) == (2.0, 1.0)
    assert math.isnan(mann_whitney_u([], [1])[1])


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
    assert "<svg" in html.read_text() and "Mann-Whitney" in html.read_text()
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
