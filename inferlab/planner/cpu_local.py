"""`--hardware cpu-local`'s figures (measure.py measures them) as a JSON cache, measured again
when it is stale, cut short or from a busy minute, and as the Hardware a plan is costed on."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from inferlab.config import CPU_KV_CACHE_BYTES
from inferlab.errors import InferlabError
from inferlab.planner import measure
from inferlab.planner.hardware import CPU_LOCAL, Hardware
from inferlab.planner.measure import (
    MEASUREMENT_VERSION,
    cpu_name,
    describe_slow_point,
    slow_stream_points,
)
from inferlab.user_files import check_writable

DEFAULT_CACHE_PATH = Path.home() / ".cache" / "inferlab" / "cpu-local.json"
MEASURED_KEYS = ("memory_bandwidth_bytes_per_s", "stream_bytes_per_s", "peak_flops",
                 "layer_overhead_s", "memory_bytes")
CPU_RUNTIME_OVERHEAD_BYTES = 2**29  # the Python process with torch loaded


def load_or_measure(cache_path: Path, remeasure: bool = False, repeats: int = 3) -> dict[str, Any]:
    """The cached figures if they were measured on this CPU on an idle machine, else a new
    measurement, cached."""
    if cache_path.is_file():
        cached = _read_cache(cache_path)  # read under --measure too: a file that is no cache stays
        if not remeasure and cached.get("cpu") == cpu_name() and _well_formed(cached):
            slow = slow_stream_points(cached["stream_bytes_per_s"])
            if cached.get("measurement_version") != MEASUREMENT_VERSION:
                print(f"note: --cache {cache_path}: measured by an older inferlab, whose weight "
                      "streaming rates could be too high; measuring again", file=sys.stderr)
            elif not slow:
                return cached
            else:
                print(f"note: --cache {cache_path}: {describe_slow_point(cached['stream_bytes_per_s'], slow[0])}"
                      f", so the machine was busy then; measuring again", file=sys.stderr)
    _prepare_cache(cache_path)
    figures = measure.measure_cpu(repeats)
    try:
        cache_path.write_text(json.dumps(figures, indent=2) + "\n")
    except OSError as e:
        raise InferlabError(f"--cache {cache_path}: cannot write ({e.strerror})") from None
    return figures


def _prepare_cache(cache_path: Path) -> None:
    """Make the cache's folder (the default one may be new) and open the file as the write
    will, before a minute of measuring rather than after it."""
    blocker = next((p for p in cache_path.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # mkdir would say only "File exists" or "Not a directory"
        raise InferlabError(f"--cache {cache_path}: {blocker} is not a folder")
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InferlabError(f"--cache {cache_path}: cannot make folder {cache_path.parent} "
                            f"({e.strerror})") from None
    check_writable(str(cache_path), "--cache")


def _read_cache(cache_path: Path) -> dict[str, Any]:
    """The cache's figures; an unreadable cache is measured again and rewritten, but a file
    that is no cache at all is refused rather than overwritten."""
    try:
        cached = json.loads(cache_path.read_text(encoding="utf-8"))
    except OSError:
        return {}
    except ValueError:  # not JSON, or not UTF-8
        cached = None
    if not isinstance(cached, dict) or "cpu" not in cached:  # a cache, however stale, names its CPU
        raise InferlabError(f"--cache {cache_path}: not a cpu-local cache (a JSON object naming "
                            f"its \"cpu\"); remove it or choose another path")
    return cached


def _well_formed(cached: dict[str, Any]) -> bool:
    """Whether a cache holds every figure, each a rate or size above 0 (the layer overhead at
    least 0), as measure_cpu writes them: one edited by hand or cut short is measured again
    rather than planned from (a zero rate divided by, a string read as bytes)."""
    def positive(value: Any, allow_zero: bool = False) -> bool:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and (value >= 0 if allow_zero else value > 0))

    def rates(table: Any) -> bool:
        return isinstance(table, dict) and bool(table) and all(positive(v) for v in table.values())

    def grid_of_rates(grid: Any) -> bool:
        return isinstance(grid, dict) and bool(grid) and all(
            str(rows).isdecimal() and isinstance(by_width, dict) and rates(by_width)
            and all(str(width).isdecimal() for width in by_width) for rows, by_width in grid.items())

    return (all(k in cached for k in (*MEASURED_KEYS, "threads", "torch", "measured_at"))
            and positive(cached["memory_bytes"]) and positive(cached["memory_bandwidth_bytes_per_s"])
            and positive(cached["layer_overhead_s"], allow_zero=True) and rates(cached["peak_flops"])
            and grid_of_rates(cached["stream_bytes_per_s"])
            and ("codes_stream_bytes_per_s" not in cached or grid_of_rates(cached["codes_stream_bytes_per_s"])))


def planning_grid(figures: dict[str, Any], codes: bool) -> str:
    """The stream grid a plan's weights stream at: the codes' where `codes` and measured."""
    return "codes_stream_bytes_per_s" if codes and "codes_stream_bytes_per_s" in figures else "stream_bytes_per_s"


def cpu_local_hardware(figures: dict[str, Any], codes: bool = False) -> Hardware:
    """Measured rates are reachable ones: efficiencies are 1. `codes`: weights streamed at the
    rates of layers held as GGUF codes, where measured (a GGUF file the engine holds so)."""
    key = planning_grid(figures, codes)

    def grid(name: str) -> dict[int, dict[int, float]]:
        return {int(n): {int(w): float(b) for w, b in by_width.items()} for n, by_width in figures[name].items()}

    return Hardware(
        name=CPU_LOCAL,
        memory_bytes=int(figures["memory_bytes"]),
        memory_bandwidth_bytes_per_s=float(figures["memory_bandwidth_bytes_per_s"]),
        stream_rates=grid(key),
        kv_stream_rates=grid("stream_bytes_per_s") if key != "stream_bytes_per_s" else None,  # plain reads
        peak_flops={k: float(v) for k, v in figures["peak_flops"].items()},
        interconnect_bytes_per_s=float(figures["memory_bandwidth_bytes_per_s"]),
        source=(f"measured on {figures['cpu']} with {figures['threads']} threads, "
                f"torch {figures['torch']}, {figures['measured_at']}; bandwidth: "
                f"{figures.get('linear_dtype', 'bfloat16')} matmuls streaming weights"
                f"{' held as Q4_1 codes' if key.startswith('codes') else ''}, by layer width and rows (a plain copy: "
                f"{figures.get('copy_bandwidth_bytes_per_s', 0) / 1e9:.1f} GB/s)"),
        runtime_overhead_bytes=CPU_RUNTIME_OVERHEAD_BYTES,
        bandwidth_efficiency=1.0,
        compute_efficiency=1.0,
        layer_overhead_s=float(figures["layer_overhead_s"]),
        measured=True,
        engine_kv_cache_bytes=CPU_KV_CACHE_BYTES,
    )
