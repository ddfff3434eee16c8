"""`inferlab plan`: memory, capacity, speed and cost of a model on some hardware, before deploying."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path

from inferlab.config import parse_bytes
from inferlab.errors import InferlabError
from inferlab.planner.budget import KV_DTYPES, MemoryConfig
from inferlab.planner.calibration import compare, load_bench_result, render_comparisons
from inferlab.planner.capacity import SLO, Workload
from inferlab.planner.cpu_local import DEFAULT_CACHE_PATH, cpu_local_hardware, load_or_measure
from inferlab.planner.gguf_held import held_format
from inferlab.planner.hardware import CPU_LOCAL, HARDWARE, Hardware, datasheet_hardware
from inferlab.planner.memory import WeightFormat, weight_format
from inferlab.planner.model_shapes import ModelSpec, checkpoint_weight_format, resolve_model
from inferlab.planner.plan import PlanInputs, build_plan
from inferlab.planner.presets import PRESETS
from inferlab.planner.report_html import render_html
from inferlab.planner.report_text import render_text
from inferlab.planner.units import format_bytes, format_rate
from inferlab.user_files import check_writable, write_user_text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="memory, capacity, speed and cost before deploying",
                              description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="model directory, GGUF file or preset name (default: the embedded SmolLM2-135M)")
    p.add_argument("--hardware", default=CPU_LOCAL,
                   help=f"accelerator name or {CPU_LOCAL} (measured); see --list (default: {CPU_LOCAL})")
    p.add_argument("--measure", action="store_true", help=f"measure this machine again for {CPU_LOCAL}")
    p.add_argument("--cache", type=Path, default=None, help="where the cpu-local figures are cached")
    p.add_argument("--list", action="store_true", help="list model presets and hardware, then exit")
    p.add_argument("--weight-format", default=None,
                   help="bf16, fp16, fp32, fp8, int8 (W8A8), int8-wo, int4-g128 (any group size); "
                        "-asym after int8-wo or int4-g… adds zero points "
                        f"(default: a compressed-tensors checkpoint's own, else bf16; on {CPU_LOCAL} "
                        "fp32 where the CPU has no fast bf16, as the engine's --dtype auto, and there a "
                        "GGUF's Q4_0/Q4_1/Q8_0 linears as the codes the engine holds them in)")
    p.add_argument("--kv-dtype", default=None,
                   help=f"one of {', '.join(KV_DTYPES)} (default: the weights' dense dtype, as "
                        f"vLLM's kv_cache_dtype auto and the engine take it; on {CPU_LOCAL} only "
                        "that one)")
    p.add_argument("--gpu-memory-utilization", type=float, default=MemoryConfig.gpu_memory_utilization)
    p.add_argument("--tensor-parallel", "-tp", type=int, default=MemoryConfig.tensor_parallel)
    p.add_argument("--memory", default=None, help="override the device memory (e.g. 24GiB)")
    p.add_argument("--kv-cache-memory", default=None,
                   help="a fixed KV cache budget per device (e.g. 64MiB), as the engine's option "
                        f"(default on {CPU_LOCAL}: the engine's CPU default)")
    p.add_argument("--block-size", type=int, default=MemoryConfig.block_size)
    p.add_argument("--max-num-seqs", type=int, default=MemoryConfig.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=MemoryConfig.max_num_batched_tokens)
    p.add_argument("--runtime-overhead", default=None, help="override the runtime overhead (e.g. 2GiB)")
    p.add_argument("--context-len", type=int, default=None,
                   help="sequence length for the concurrency figure only; capacity and cost follow "
                        "the workload's prompt + output (default: prompt + output)")
    p.add_argument("--workload", default="prompt=1024,output=256", help="prompt=N,output=N tokens")
    p.add_argument("--slo", default="", help="latency targets, e.g. ttft_ms=500,itl_ms=50")
    p.add_argument("--request-rate", type=float, default=None, help="requests/s to serve")
    p.add_argument("--price-per-hour", type=float, default=None, help="price of one device-hour")
    p.add_argument("--bandwidth-efficiency", type=float, default=None,
                   help="share of the datasheet bandwidth reached (default 0.8; 1 when measured)")
    p.add_argument("--compute-efficiency", type=float, default=None,
                   help="share of the datasheet FLOP/s reached (default 0.6; 1 when measured)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--html", type=Path, default=None, help="write a self-contained HTML report")
    p.add_argument("--compare-bench", type=Path, default=None, metavar="RESULT.json",
                   help="compare an `inferlab bench` result with the prediction")
    p.set_defaults(func=run_plan)


def _size(text: str, flag: str) -> int:
    """A size flag's bytes, at least one: a bare number is bytes, so '0.5' is 0, not half a GiB."""
    size = parse_bytes(text, flag)
    if size <= 0:
        raise InferlabError(f"{flag} must be at least 1 byte, got {text!r} ({size} bytes: a number "
                            "without a unit is bytes); give a size such as 24GiB or 512MiB")
    return size


def resolve_hardware(args: argparse.Namespace, stand_in: bool = False, codes: bool = False) -> Hardware:
    """--hardware with its overrides; `stand_in`: a datasheet device in place of cpu-local, to
    check the other settings before this machine is measured; `codes`: cpu-local's rates for
    weights held as GGUF codes."""
    cpu_local = _is_cpu_local(args)
    if args.measure and not cpu_local:
        raise InferlabError(f"--measure measures this machine; it goes with --hardware {CPU_LOCAL}, "
                            f"not {args.hardware}")
    datasheet = None if cpu_local else datasheet_hardware(args.hardware)
    memory = None if args.memory is None else _size(args.memory, "--memory")
    overhead = None if args.runtime_overhead is None else parse_bytes(args.runtime_overhead,
                                                                     "--runtime-overhead")
    if datasheet is None:
        datasheet = (next(iter(HARDWARE.values())) if stand_in
                     else cpu_local_hardware(load_or_measure(args.cache or DEFAULT_CACHE_PATH, args.measure), codes))
    return datasheet.with_overrides(memory_bytes=memory, runtime_overhead_bytes=overhead,
                             bandwidth_efficiency=args.bandwidth_efficiency,
                             compute_efficiency=args.compute_efficiency)


def _is_cpu_local(args: argparse.Namespace) -> bool:
    return args.hardware.lower() == CPU_LOCAL


def build_inputs(args: argparse.Namespace) -> PlanInputs:
    cpu_local = _is_cpu_local(args)
    if cpu_local and args.tensor_parallel != 1:
        raise InferlabError(f"--tensor-parallel {args.tensor_parallel}: inferlab's engine runs "
                            f"{CPU_LOCAL} as one device (no tensor parallelism); use 1")
    model = resolve_model(args.model)
    dense = _dense_default(cpu_local)
    fmt = (weight_format(args.weight_format) if args.weight_format is not None
           else checkpoint_weight_format(model) or (cpu_local and held_format(model.source, dense))
           or weight_format(dense))
    if cpu_local and fmt.name not in ("bf16", "fp16", "fp32"):  # its dense layers: --dtype auto's
        fmt = dataclasses.replace(fmt, dense_dtype=dense)
    if cpu_local and args.kv_dtype is not None and args.kv_dtype.lower() != fmt.dense_dtype:
        raise InferlabError(f"--kv-dtype {args.kv_dtype}: inferlab's engine keeps the KV cache in "
                            f"the weights' dense dtype ({fmt.dense_dtype}) on {CPU_LOCAL}; leave "
                            f"--kv-dtype out")
    kv_bytes = None if args.kv_cache_memory is None else _size(args.kv_cache_memory, "--kv-cache-memory")
    inputs = functools.partial(_inputs, args, model, fmt, Workload.parse(args.workload),
                               SLO.parse(args.slo), kv_bytes)
    if cpu_local:  # every setting checked before measuring (15-45 s)
        inputs(resolve_hardware(args, stand_in=True))
    return inputs(resolve_hardware(args, codes=bool(fmt.gguf_types)))


def _dense_default(cpu_local: bool) -> str:
    """bf16, but on this machine what the engine's --dtype auto runs: fp32 on a CPU without fast
    bf16 (no AMX or AVX512-BF16)."""
    if not cpu_local:
        return "bf16"
    from inferlab.engine.platform import cpu_has_fast_bf16

    return "bf16" if cpu_has_fast_bf16() else "fp32"


def _inputs(args: argparse.Namespace, model: ModelSpec, fmt: WeightFormat, workload: Workload,
            slo: SLO, kv_bytes: int | None, hw: Hardware) -> PlanInputs:
    memory = MemoryConfig(
        device_memory_bytes=hw.memory_bytes, gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel=args.tensor_parallel, kv_dtype=(args.kv_dtype or fmt.dense_dtype).lower(),
        block_size=args.block_size, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        runtime_overhead_bytes=hw.runtime_overhead_bytes,
        kv_cache_bytes=hw.engine_kv_cache_bytes if kv_bytes is None else kv_bytes,
    )
    return PlanInputs(
        model=model, hardware=hw, weight_format=fmt,
        memory=memory, workload=workload, slo=slo,
        request_rate=args.request_rate, price_per_gpu_hour=args.price_per_hour,
        context_len=args.context_len,
    )


def list_tables() -> str:
    lines = ["Model presets:"]
    lines += [f"  {name:<16} {source}" for name, (_, source) in PRESETS.items()]
    lines.append("Hardware:")
    lines += [f"  {h.name:<12} {format_bytes(h.memory_bytes):>10} "
              f"{format_rate(h.memory_bandwidth_bytes_per_s, 'B/s'):>10} "
              f"bf16 {format_rate(h.peak_flops['bf16'], 'FLOP/s'):>12}  {h.source}"
              for h in HARDWARE.values()]
    lines.append(f"  {CPU_LOCAL:<12} this machine, measured (inferlab plan --measure)")
    return "\n".join(lines) + "\n"


def list_json() -> dict:
    """list_tables' presets and hardware, for --list --json."""
    return {"models": {name: source for name, (_, source) in PRESETS.items()},
            "hardware": [{"name": h.name, "memory_bytes": h.memory_bytes,
                          "memory_bandwidth_bytes_per_s": h.memory_bandwidth_bytes_per_s,
                          "peak_flops": h.peak_flops, "source": h.source} for h in HARDWARE.values()]
            + [{"name": CPU_LOCAL, "source": "this machine, measured (inferlab plan --measure)"}]}


def run_plan(args: argparse.Namespace) -> int:
    if args.list:
        if args.json:
            print(json.dumps(list_json(), indent=2))
        else:
            print(list_tables(), end="")
        return 0
    if args.html is not None:
        check_writable(str(args.html), "--html")
    plan = build_plan(build_inputs(args))
    comparisons = [] if args.compare_bench is None else compare(plan, load_bench_result(args.compare_bench))
    if args.json:
        out = plan.to_dict()
        if comparisons:
            out["compare_bench"] = [
                {"run": c.label, "concurrency": c.concurrency, "workload": vars(c.workload),
                 "measured": c.measured, "predicted": c.predicted,
                 "ratio": {k: c.ratio(k) for k in c.predicted}} for c in comparisons]
        print(json.dumps(out, indent=2))
    else:
        print(render_text(plan), end="")
        if comparisons:
            print("\n" + render_comparisons(comparisons), end="")
    if args.html is not None:
        try:
            write_user_text(args.html, render_html(plan))
        except OSError as e:
            raise InferlabError(f"--html: cannot write {args.html}: {e.strerror}") from None
    return 0
