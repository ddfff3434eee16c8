"""cpu-local: the micro-benchmark's figures and its cache; a weight-streaming rate measured
while the machine was busy is measured again, in a cache and in a fresh measurement, rather than
planned with (timings injected, no measuring)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from inferlab.engine.platform import cpu_has_fast_bf16
from inferlab.errors import InferlabError
from inferlab.kernels import cpu_ops
from inferlab.planner import measure
from inferlab.planner.cpu_local import cpu_local_hardware, load_or_measure
from inferlab.planner.gguf_held import layer_bytes
from inferlab.planner.hardware import Hardware
from inferlab.planner.measure import (
    _checked_stream_grid,
    cpu_name,
    layer_linear_shapes,
    physical_memory_bytes,
)


def test_measures_once_then_reads_the_cache(tmp_path, monkeypatch):
    # on this shared machine a grid point may stay slow, and the read below would measure again
    # (the busy-machine tests below cover that with injected timings)
    monkeypatch.setattr("inferlab.planner.measure.NEIGHBOUR_TOLERANCE", float("inf"))
    cache = tmp_path / "sub" / "cpu-local.json"
    figures = load_or_measure(cache, repeats=1)
    # positive and below any hardware's: this machine is shared, so no lower bound of interest
    assert 0 < figures["memory_bandwidth_bytes_per_s"] < 2e12
    assert 0 < figures["copy_bandwidth_bytes_per_s"] < 2e12
    grid = figures["stream_bytes_per_s"]
    assert list(grid) == ["1", "16"] and list(grid["1"]) == ["512", "1024", "2048", "4096"]
    assert figures["memory_bandwidth_bytes_per_s"] == max(max(g.values()) for g in grid.values())
    assert 0 < figures["layer_overhead_s"] < 1.0
    for dtype in ("bf16", "fp32"):
        assert 0 < figures["peak_flops"][dtype] < 1e14
    assert figures["memory_bytes"] == physical_memory_bytes() and figures["cpu"] == cpu_name()
    # the grid streams the weights in the dtype the engine runs here (fp32 without fast bf16)
    assert figures["linear_dtype"] == ("bfloat16" if cpu_has_fast_bf16() else "float32")
    # and, where the engine holds GGUF blocks as codes, a grid of layers held so
    codes = figures.get("codes_stream_bytes_per_s")
    assert (codes is not None) == measure.engine_holds_codes()
    assert codes is None or {rows: list(by_width) for rows, by_width in codes.items()} == {
        rows: list(by_width) for rows, by_width in grid.items()}
    assert json.loads(cache.read_text()) == figures
    # a second call returns the cached figures as they were written, without measuring
    assert load_or_measure(cache) == figures
    hw = cpu_local_hardware(figures)
    assert hw.measured and hw.bandwidth_efficiency == 1.0 and hw.flops_for("fp8") == (
        figures["peak_flops"]["bf16"], "bf16")


@pytest.mark.parametrize("seconds_by_side, largest, side", [
    ({256: 0.001, 512: 0.008, 1024: 0.064, 2048: 0.5}, 2048, 1024),  # stops at 20 ms or more
    ({256: 1e-5, 512: 1e-4, 1024: 1e-3}, 1024, 1024),  # fast: up to the largest side, no further
    ({256: 0.11}, 2048, 256),  # bf16 without AVX512-BF16: one small product (2048^3 took 58 s)
])
def test_the_matmul_rate_grows_the_square_until_a_product_takes_20_ms(monkeypatch, seconds_by_side,
                                                                       largest, side):
    sides = []
    monkeypatch.setattr(measure, "_matmuls", lambda dtype: [lambda a, b: sides.append(a.shape[0])])
    monkeypatch.setattr(measure, "best_seconds", lambda fn, repeats: (fn(), seconds_by_side[sides[-1]])[1])
    rate = measure._matmul_flops(torch.float32, largest, repeats=1)
    assert sides[-1] == side and sides == [256 * 2**i for i in range(len(sides))]
    assert rate == pytest.approx(2 * side**3 / seconds_by_side[side])


def test_a_cache_from_another_cpu_is_not_used(tmp_path, monkeypatch):
    cache = tmp_path / "cpu-local.json"
    stale = {"cpu": "some other CPU", "peak_flops": {"bf16": 1.0, "fp32": 1.0}, "layer_overhead_s": 0.0,
             "memory_bandwidth_bytes_per_s": 1.0, "memory_bytes": 1, "threads": 1, "torch": "x",
             "measured_at": "2020-01-01T00:00:00+00:00"}
    cache.write_text(json.dumps(stale))
    calls = []
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu",
                        lambda repeats: calls.append(repeats) or stale | {"cpu": cpu_name()})
    figures = load_or_measure(cache)
    assert calls == [3] and figures["cpu"] == cpu_name()


@pytest.mark.parametrize("remeasure", [False, True], ids=["cached", "--measure"])
@pytest.mark.parametrize("content", [b"\xff\xfe", b"[]", b"not json", b"hello\n",
                                     b'{"name": "my-app", "dependencies": {}}'])
def test_a_file_that_is_no_cache_is_refused_not_overwritten(tmp_path, monkeypatch, content,
                                                            remeasure):
    """Once a traceback (bad UTF-8, a list); text that is not JSON was measured over, and with
    --measure any file was; then any JSON object was (a package.json)."""
    cache = tmp_path / "notes.json"
    cache.write_bytes(content)
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu", _no_measuring)
    with pytest.raises(InferlabError, match="not a cpu-local cache"):
        load_or_measure(cache, remeasure)
    assert cache.read_bytes() == content


def _no_measuring(repeats):
    raise AssertionError("measured instead of refusing the file")


def test_streaming_rate_is_interpolated_on_log_scales():
    hw = Hardware("grid", 10**9, 1e9, {"bf16": 1e12}, 1e9, "test",
                  stream_rates={1: {512: 10e9, 2048: 30e9}, 16: {512: 2e9, 2048: 6e9}})
    assert hw.bandwidth_for(1024) == pytest.approx(20e9)  # halfway between 512 and 2048 in log width
    assert hw.bandwidth_for(256) == 10e9 and hw.bandwidth_for(8192) == 30e9  # clamped
    assert hw.bandwidth_for(1024, rows=16) == pytest.approx(4e9)
    assert hw.bandwidth_for(1024, rows=4) == pytest.approx(12e9)  # halfway in log rows, 1 to 16
    assert hw.bandwidth_for(1024, rows=64) == pytest.approx(4e9)
    # a faster many-row kernel does not make a bigger batch's step shorter than a smaller one's
    faster = Hardware("grid", 10**9, 1e9, {"bf16": 1e12}, 1e9, "test",
                      stream_rates={1: {512: 10e9}, 16: {512: 20e9}})
    assert faster.bandwidth_for(512, rows=16) == 10e9
    assert Hardware("flat", 10**9, 7e9, {"bf16": 1e12}, 1e9, "test").bandwidth_for(576) == 7e9


def test_stream_layers_have_llama_proportions():
    # SmolLM2's layer: hidden 576, MLP 1536 = 8/3 × 576
    assert layer_linear_shapes(576) == [(576, 1152), (576, 576), (576, 3072), (1536, 576)]


@pytest.mark.parametrize(("where", "words"), [
    ("afile.txt/c.json", "{tmp}/afile.txt/c.json: {tmp}/afile.txt is not a folder"),
    ("afile.txt/sub/c.json", "{tmp}/afile.txt/sub/c.json: {tmp}/afile.txt is not a folder"),
    ("emptydir", "{tmp}/emptydir: cannot write (Is a directory)"),
])
def test_an_unwritable_cache_fails_before_measuring(tmp_path, monkeypatch, where, words):
    """Once a minute of measuring, then a raw "[Errno 17] File exists" or "[Errno 21]"."""
    (tmp_path / "afile.txt").write_text("notes\n")
    (tmp_path / "emptydir").mkdir()
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu", _no_measuring)
    with pytest.raises(InferlabError) as caught:
        load_or_measure(tmp_path / where)
    assert str(caught.value) == "--cache " + words.format(tmp=tmp_path)
    assert (tmp_path / "afile.txt").read_text() == "notes\n" and not any((tmp_path / "emptydir").iterdir())


def test_a_failed_cache_write_names_the_reason_not_the_errno(tmp_path, monkeypatch):
    cache = tmp_path / "cpu-local.json"
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu", lambda repeats: {"cpu": cpu_name()})

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(InferlabError) as caught:
        load_or_measure(cache)
    assert str(caught.value) == f"--cache {cache}: cannot write (No space left on device)"


GOOD = {"cpu": None, "measurement_version": measure.MEASUREMENT_VERSION, "peak_flops": {"bf16": 4e11, "fp32": 1e11}, "layer_overhead_s": 1e-5,
        "memory_bandwidth_bytes_per_s": 3e10, "memory_bytes": 2**34, "threads": 2, "torch": "x",
        "measured_at": "2026-12-05T00:00:00+00:00",
        "stream_bytes_per_s": {"1": {"512": 2e10, "4096": 3e10}, "16": {"512": 2e10, "4096": 3e10}}}


@pytest.mark.parametrize("edit", [
    {"memory_bandwidth_bytes_per_s": 0},  # once a ZeroDivisionError in the estimate
    {"memory_bytes": "abc"},  # once a ValueError
    {"stream_bytes_per_s": [1, 2]},  # once an AttributeError
    {"memory_bandwidth_bytes_per_s": None},  # once a TypeError
    {"peak_flops": {"bf16": float("nan")}},  # once planned, with nan in the ITL column
    {"stream_bytes_per_s": {"1": {"wide": 3e10}}},
    {"codes_stream_bytes_per_s": {"1": {"512": 0}}},
    {"layer_overhead_s": -1},
])
def test_a_cache_with_a_broken_figure_is_measured_again(tmp_path, monkeypatch, edit):
    cache = tmp_path / "cpu-local.json"
    cache.write_text(json.dumps(GOOD | {"cpu": cpu_name()} | edit))
    fresh = GOOD | {"cpu": cpu_name()}
    calls = []
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu",
                        lambda repeats: calls.append(repeats) or fresh)
    assert load_or_measure(cache) == fresh and calls == [3]
    assert json.loads(cache.read_text()) == fresh  # rewritten, as an unreadable cache is


def test_a_cache_from_an_older_measurement_is_measured_again(tmp_path, monkeypatch, capsys):
    """Version 1's stream rates were 2.7-3x the memory's on an AVX2 CPU (see _stream_layers)."""
    cache = tmp_path / "cpu-local.json"
    old = {key: value for key, value in GOOD.items() if key != "measurement_version"} | {"cpu": cpu_name()}
    cache.write_text(json.dumps(old))
    fresh = GOOD | {"cpu": cpu_name()}
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu", lambda repeats: fresh)
    assert load_or_measure(cache) == fresh and json.loads(cache.read_text()) == fresh
    assert capsys.readouterr().err == (f"note: --cache {cache}: measured by an older inferlab, whose "
                                       "weight streaming rates could be too high; measuring again\n")


def test_cpu_local_plans_codes_at_their_own_rates():
    figures = GOOD | {"cpu": cpu_name(), "codes_stream_bytes_per_s": {"1": {"512": 1e10}, "16": {"512": 2e9}}}
    assert cpu_local_hardware(figures).bandwidth_for(512, 1) == 2e10
    assert cpu_local_hardware(figures, codes=True).bandwidth_for(512, 16) == pytest.approx(2e9)
    assert cpu_local_hardware(GOOD | {"cpu": cpu_name()}, codes=True).bandwidth_for(512, 1) == 2e10


@pytest.mark.skipif(not measure.engine_holds_codes(), reason="the engine holds no GGUF codes here")
def test_the_codes_layers_hold_what_the_planner_costs_q4_1_at():
    """Their constant weights narrow to Q4_1 codes: 4 bits, an fp32 scale and offset per 32."""
    linears, held = measure._stream_layers(512, narrow=True)
    planned = [layer_bytes("Q4_1", m.in_features, m.out_features) for m in linears]  # (codes, scales, offsets)
    assert held == sum(codes + 4 * scales + offsets for codes, scales, offsets in planned)


def test_the_streamed_layers_hold_every_weight_their_rate_counts():
    """The rate is bytes held over seconds: layers narrowed to codes (their constant weights are
    exact Q4_1 blocks) read 0.19x the bytes, and the rate came out 2.7-3x the memory's."""
    linears, held = measure._stream_layers(512)
    weights = sum(m.in_features * m.out_features for m in linears)
    assert held == weights * measure.engine_dtype().itemsize


@pytest.mark.parametrize("rows", [1, 16])
def test_the_stream_runs_each_linear_as_the_c_forward_does(rows):
    """Where the C forward runs, a linear with a C kernel is timed by that kernel's call alone
    (its status back); elsewhere, and for a linear without one, the module runs (its output)."""
    linears, _ = measure._constant_linears([(256, 64), (64, 256)], narrow=False)
    linears.append(torch.nn.Linear(64, 32, bias=False).to(measure.engine_dtype()))  # no C kernel
    in_c = cpu_ops.model_forward_available(measure.engine_dtype())
    for linear in linears:
        x = torch.randn(rows, linear.in_features, dtype=measure.engine_dtype())
        out = measure._as_the_engine_calls(linear, x)()
        if in_c and hasattr(linear, "c_desc"):
            assert out == 0
        else:
            assert torch.equal(out, linear(x))


def test_a_well_formed_cache_is_read_as_it_is(tmp_path, monkeypatch):
    cache = tmp_path / "cpu-local.json"
    cache.write_text(json.dumps(GOOD | {"cpu": cpu_name()}))
    monkeypatch.setattr("inferlab.planner.measure.measure_cpu", lambda repeats: pytest.fail("measured"))
    assert load_or_measure(cache) == GOOD | {"cpu": cpu_name()}


# The tester's cache from a busy machine: 92 MB/s at width 512 beside 3.9 GB/s at 1024 (42x),
# which planned SmolLM2 (width 576) at 401 ms a token instead of ~6 ms.
BUSY_GRID = {"1": {"512": 91898822.5, "1024": 3893886770.9, "2048": 12096906995.4, "4096": 6135320381.6},
             "16": {"512": 2170380240.8, "1024": 5571854425.9, "2048": 1493948594.1, "4096": 5845930817.2}}
# the same machine idle: neighbouring widths within 1.7x of each other
IDLE_GRID = {"1": {"512": 47074976404.9, "1024": 64332419516.0, "2048": 70e9, "4096": 78864171341.9},
             "16": {"512": 25821649488.7, "1024": 35341722053.4, "2048": 40355302806.5, "4096": 42598449298.7}}


def _figures(grid: dict) -> dict:
    return {"cpu": cpu_name(), "measurement_version": measure.MEASUREMENT_VERSION, "threads": 2,
            "torch": "test", "stream_bytes_per_s": grid,
            "copy_bandwidth_bytes_per_s": 80e9, "peak_flops": {"bf16": 9e11, "fp32": 4.8e11},
            "layer_overhead_s": 1.4e-5, "memory_bytes": 24 * 2**30,
            "measured_at": "2026-12-05T17:40:42+00:00",
            "memory_bandwidth_bytes_per_s": max(max(g.values()) for g in grid.values())}


def test_a_cache_with_a_busy_grid_point_is_measured_again(tmp_path, monkeypatch, capsys):
    """Once used as it was: the plan's ITL was 401 ms against 6.3 ms re-measured."""
    cache = tmp_path / "cpu-local.json"
    cache.write_text(json.dumps(_figures(BUSY_GRID)))
    calls = []
    monkeypatch.setattr(measure, "measure_cpu", lambda repeats: calls.append(repeats) or _figures(IDLE_GRID))
    assert load_or_measure(cache) == _figures(IDLE_GRID)
    assert calls == [3] and json.loads(cache.read_text()) == _figures(IDLE_GRID)
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"note: --cache {cache}: weight streaming at width 512, 1 row ran at 91.9 MB/s against "
        "3.89 GB/s at width 1024, over 4x apart, so the machine was busy then; measuring again\n")


def test_a_consistent_cache_is_used_as_it_is(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cpu-local.json"
    cache.write_text(json.dumps(_figures(IDLE_GRID)))
    monkeypatch.setattr(measure, "measure_cpu", _no_measuring_again)
    assert load_or_measure(cache) == _figures(IDLE_GRID)
    assert capsys.readouterr() == ("", "")


def _no_measuring_again(repeats):
    raise AssertionError("measured a consistent cache again")


@pytest.mark.parametrize(("low", "high", "slow"), [
    (1e9, 4e9, False),  # 4x: what per-call costs alone can make of widths 2x apart
    (1e9, 4.1e9, True),
])
def test_the_tolerance_is_four_times_either_way(low, high, slow):
    assert bool(measure.slow_stream_points({"1": {"512": low, "1024": high}})) == slow
    assert bool(measure.slow_stream_points({"1": {"512": high, "1024": low}})) == slow


def _fake_widths(monkeypatch, rates: dict[int, list[float]]) -> list[int]:
    """Each width measures at the rates given, one per call (both rows alike); returns the
    widths measured, in order."""
    measured = []

    def fake(width, repeats, narrow=False):
        measured.append(width)
        rate = rates[width].pop(0) if len(rates[width]) > 1 else rates[width][0]
        return {"1": rate, "16": rate / 2}

    monkeypatch.setattr(measure, "_stream_bytes_per_s", fake)
    return measured


def test_a_busy_grid_point_is_measured_again_keeping_the_best(monkeypatch, capsys):
    """The tester's fresh measurement: 4.8 GB/s at width 2048 beside 64 and 79 GB/s."""
    measured = _fake_widths(monkeypatch, {512: [47e9], 1024: [64e9], 2048: [4.8e9, 15e9, 70e9, 30e9],
                                          4096: [79e9]})
    grid = _checked_stream_grid(3)
    # 2048 again twice: 15 GB/s is still over 4x below 1024's 64 and 4096's 79 GB/s, 70 is not
    assert measured == [512, 1024, 2048, 4096, 2048, 2048]
    assert grid == {"1": {"512": 47e9, "1024": 64e9, "2048": 70e9, "4096": 79e9},
                    "16": {"512": 23.5e9, "1024": 32e9, "2048": 35e9, "4096": 39.5e9}}
    assert capsys.readouterr() == ("", "")


def test_a_grid_point_that_stays_slow_is_used_with_a_warning(monkeypatch, capsys):
    measured = _fake_widths(monkeypatch, {512: [47e9], 1024: [64e9], 2048: [4.8e9, 6e9, 5e9, 1e9],
                                          4096: [79e9]})
    grid = _checked_stream_grid(3)
    assert measured == [512, 1024, 2048, 4096, 2048, 2048, 2048] and grid["1"]["2048"] == 6e9
    out, err = capsys.readouterr()
    assert out == "" and err == (
        "warning: the machine was busy while measuring: weight streaming at width 2048, 1 row ran "
        "at 6 GB/s against 64 GB/s at width 1024, over 4x apart after 3 re-measurements; the "
        "figures and plans from them may be off (measure again when the machine is idle)\n")
