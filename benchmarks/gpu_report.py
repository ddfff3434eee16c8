"""The settings, report, timer and ceilings that every section of benchmarks/gpu.py shares."""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from gpu_models import LLAMA_8B, TINY

# --- the run's settings and its report ----------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    device: torch.device
    model: dict  # ModelConfig fields of the big model
    copy_bytes: int  # bandwidth probe size
    matmul_n: int
    num_requests: int  # the concurrent workload
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]
    hf_requests: int  # the subset both engines run for the transformers comparison
    single_prompt: int
    single_output: int
    quant_batch: int  # concurrent decodes in the quantized comparison
    greedy_tokens: int
    embedded_gguf: str | None

    @property
    def smoke(self) -> bool:
        return self.device.type == "cpu"


def settings_from(args: argparse.Namespace) -> Settings:
    if args.smoke:
        return Settings(torch.device("cpu"), TINY, 2**24, 256, 8, (8, 32), (4, 16), 4, 16, 8, 4,
                        8, args.embedded_gguf)
    return Settings(torch.device("cuda"), LLAMA_8B, 2**32, 8192, args.num_requests,
                    (128, 1024), (128, 1024), args.hf_requests, 128, 256, 64, 32,
                    args.embedded_gguf)


@dataclass
class Report:
    smoke: bool = False  # on CPU the targets are not targets: shown, never failed
    rows: list[tuple[str, str, float | str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def add(self, section: str, metric: str, value: float | str, unit: str = "") -> None:
        self.rows.append((section, metric, value, unit))
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {section:<10} {metric:<58} {shown} {unit}", flush=True)

    def check(self, section: str, what: str, ok: bool, detail: str) -> None:
        self.add(section, what, "PASS" if ok else "FAIL", detail)
        if not ok:
            self.failures.append(f"{section}: {what} ({detail})")

    def target(self, section: str, what: str, ok: bool, detail: str) -> None:
        """A figure the issue sets a bar for (a GPU figure: on the smoke run only shown)."""
        if self.smoke:
            self.add(section, what, "met" if ok else "missed", f"{detail} (smoke run: no target)")
        else:
            self.check(section, what, ok, detail)

    def as_json(self) -> dict:
        return {"rows": [dict(zip(("section", "metric", "value", "unit"), r, strict=True))
                         for r in self.rows], "failures": self.failures}


def bench_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds of fn (CUDA events via triton's do_bench on a GPU)."""
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# --- 1. ceilings -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Ceilings:
    bandwidth_bytes_per_s: float
    bf16_flops_per_s: float


def measure_ceilings(s: Settings, report: Report) -> Ceilings:
    src = torch.empty(s.copy_bytes // 2, dtype=torch.bfloat16, device=s.device).uniform_(-1, 1)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), s.device)
    bandwidth = 2 * s.copy_bytes / (ms / 1e3)
    n = s.matmul_n
    a = torch.randn(n, n, dtype=torch.bfloat16, device=s.device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=s.device)
    flops = 2 * n**3 / (bench_ms(lambda: a @ b, s.device) / 1e3)
    report.add("ceiling", f"device copy, {s.copy_bytes / 2**30:.2g} GiB (read + write)",
               bandwidth / 1e12, "TB/s")
    report.add("ceiling", f"bf16 matmul {n}^3", flops / 1e12, "TFLOP/s")
    return Ceilings(bandwidth, flops)


def run_guarded(fn: Callable, report: Report, *args: object) -> None:
    """One step failing is a finding to report, not the end of the run."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - report whatever broke and carry on
        report.check("error", fn.__name__, False, f"{type(e).__name__}: {e}"[:300])
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    raise SystemExit("a section of benchmarks/gpu.py, not a script: run benchmarks/gpu.py --help")
