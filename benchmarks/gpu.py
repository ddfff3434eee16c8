"""Every GPU check and figure of issue 9 in one run, a few minutes on an H200.

1. ceilings: HBM bandwidth (a device copy, bytes read + written) and the bf16 matmul rate
   (an 8192^3 product), measured here and used as the rooflines below;
2. kernels, compiled for the GPU: Triton paged attention, KV write, RMSNorm, RoPE, W4A16 and
   the W8A8 linears against torch references, then timed against the torch paths;
3. greedy decoding of the embedded model (fp32) by the engine equals transformers `generate`
   with the same weights on the same GPU;
4. a Llama-3.1-8B-shaped model with random bf16 weights built in memory: single-stream decode
   against the HBM roofline, with the engine's CUDA graphs and without; 256 concurrent requests (prompts 128-1024, outputs 128-1024,
   ignore_eos) against the bf16 matmul roofline; the engine against transformers `generate`
   (static batches) on the same requests;
5. W8A8 (int8, fp8) and W4A16 (int4, group 128) decode speed-ups over bf16 on that model.

Without CUDA it prints "no CUDA device" and exits 0; `--smoke` runs the whole script on CPU
with a tiny model instead, to check the script itself (its figures mean nothing there).

On the lent H200 (its python3 has torch, triton, transformers, pytest; the embedded GGUF is
94 MB, over one call's 64 MiB, so without it step 3 uses a random-weight SmolLM2-135M-shaped
model), the kernel tests compiled on the GPU, then this script:

    export PYTHONPATH=. PYTHONUNBUFFERED=1; python3 -m pytest -q -m gpu tests/kernels 2>&1 |
      tee $OUT/gpu-tests.log; python3 benchmarks/gpu.py --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.log

`--embedded-gguf PATH` points step 3 at the real file where one has been brought over.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_models import (  # noqa: E402
    LLAMA_8B,
    SMOLLM_135M,
    TINY,
    Run,
    Workload,
    hf_twin,
    make_engine,
    random_model,
    random_workload,
    run_engine,
    run_transformers,
)

from inferlab.engine.llm_engine import LLMEngine  # noqa: E402
from inferlab.models.config import ModelConfig  # noqa: E402
from inferlab.models.layers import RotaryEmbedding  # noqa: E402
from inferlab.models.llama import LlamaForCausalLM  # noqa: E402
from inferlab.models.loader import LoadedModel  # noqa: E402
from inferlab.planner.budget import MemoryConfig, plan_memory  # noqa: E402
from inferlab.planner.memory import weight_bytes, weight_format  # noqa: E402
from inferlab.planner.roofline import ModelCost, model_cost  # noqa: E402

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


# --- 2. kernels against their references, then timed ---------------------------------------------

def paged_batch(query_lens: list[int], context_lens: list[int], hq: int, hkv: int, d: int,
                block_size: int, dtype: torch.dtype, device: torch.device):
    """Random q/k/v and caches with shuffled block tables: (q, k, v, k_cache, v_cache, meta)."""
    from inferlab.kernels.attention.metadata import AttentionMetadata

    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    pages = [math.ceil(sl / block_size) for sl in seq_lens]
    order = torch.randperm(sum(pages) + 4).tolist()
    tables, used = [], 0
    for p in pages:
        tables.append(order[used:used + p])
        used += p
    shape = (len(order), block_size, hkv, d)
    k_cache = torch.randn(shape, dtype=dtype, device=device)
    v_cache = torch.randn(shape, dtype=dtype, device=device)
    n = sum(query_lens)
    q = torch.randn(n, hq, d, dtype=dtype, device=device)
    k = torch.randn(n, hkv, d, dtype=dtype, device=device)
    v = torch.randn(n, hkv, d, dtype=dtype, device=device)
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, device)
    return q, k, v, k_cache, v_cache, meta


def check_attention(s: Settings, report: Report) -> None:
    from inferlab.kernels.attention import torch_paged, triton_paged

    cases = (("mixed decode + prefill chunks", [1, 37, 1, 300, 1], [500, 0, 17, 90, 2000]),
             ("decode, split KV", [1, 1], [3000, 40]))
    heads = (32, 8, 128)
    if s.smoke:  # the interpreter runs every program in Python
        cases = (("mixed decode + prefill chunks", [1, 5, 1, 9], [20, 0, 3, 7]),
                 ("decode", [1, 1], [40, 3]))
        heads = (4, 2, 64)
    for name, q_lens, ctx in cases:
        q, k, v, kc, vc, meta = paged_batch(q_lens, ctx, *heads, 16, torch.bfloat16, s.device)
        kc2, vc2 = kc.clone(), vc.clone()
        ref = torch_paged.paged_attention(q, k, v, kc2, vc2, meta, heads[2] ** -0.5)
        out = triton_paged.paged_attention(q, k, v, kc, vc, meta, heads[2] ** -0.5)
        err = rel_error(out, ref)
        report.check("kernels", f"paged attention bf16, {name}", err < 1e-2, f"rel err {err:.1e}")
        report.check("kernels", f"KV write, {name}", torch.equal(kc, kc2) and torch.equal(vc, vc2),
                     "caches equal")


def check_norm_rope(s: Settings, report: Report) -> None:
    from inferlab.kernels.fused import torch_rms_norm, torch_rotary_embedding
    from inferlab.kernels.triton_norm_rope import rms_norm, rotary_embedding
    from inferlab.models.layers import RMSNorm

    x = torch.randn(300, 4096, dtype=torch.bfloat16, device=s.device)
    res = torch.randn_like(x)
    norm = RMSNorm(4096, 1e-5).to(s.device, torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    out, new_res = rms_norm(x, norm.weight, 1e-5, residual=res)
    err = max(rel_error(out, torch_rms_norm(x + res, norm.weight, 1e-5)), rel_error(new_res, x + res))
    exact = "residual bit-exact" if torch.equal(new_res, x + res) else "residual rounded differently"
    report.check("kernels", "fused add + RMSNorm bf16", err < 1e-2, f"rel err {err:.1e}, {exact}")
    rope = RotaryEmbedding(128, 4096, 500000.0, None).to(s.device)
    pos = torch.randint(0, 4096, (300,), device=s.device)
    q = torch.randn(300, 32, 128, dtype=torch.bfloat16, device=s.device)
    k = torch.randn(300, 8, 128, dtype=torch.bfloat16, device=s.device)
    q_ref, k_ref = torch_rotary_embedding(pos, q.float(), k.float(), rope.cos, rope.sin)
    rotary_embedding(pos, q, k, rope.cos, rope.sin)
    err = max(rel_error(q, q_ref), rel_error(k, k_ref))
    report.check("kernels", "RoPE in place bf16", err < 1e-2, f"rel err {err:.1e}")


def rtn(w: torch.Tensor, scheme: str):
    """Round-to-nearest quantization through inferlab.quant (what `inferlab quantize` writes)."""
    from inferlab.quant.qparams import quantize_rtn
    from inferlab.quant.scheme import FLOAT, GROUP, INT, WeightArgs

    args = {"W4A16": WeightArgs(4, INT, GROUP, 128), "W8A8": WeightArgs(8, INT),
            "FP8_DYNAMIC": WeightArgs(8, FLOAT)}[scheme]
    return quantize_rtn(w.float(), args, scale_dtype=torch.bfloat16 if scheme == "W4A16"
                        else torch.float32)


def check_quant_kernels(s: Settings, report: Report) -> None:
    from inferlab.kernels.scaled_mm import fp8_w8a8_linear, int8_w8a8_linear

    w = torch.randn(1024, 4096, device=s.device) * 0.02
    int4, int8, fp8 = rtn(w, "W4A16"), rtn(w, "W8A8"), rtn(w, "FP8_DYNAMIC")
    for m in (1, 300):
        x = torch.randn(m, 4096, dtype=torch.bfloat16, device=s.device)
        ref = x.float() @ int4.dequantize().T
        err = rel_error(quantized_layer_from(int4, "W4A16", None, s.device)(x), ref)
        report.check("kernels", f"W4A16 (Triton on a GPU) vs dequantize+matmul, M={m}", err < 1e-2,
                     f"rel err {err:.1e}")
        for name, qw, fn, bound in (("int8", int8, int8_w8a8_linear, 0.02),
                                    ("fp8", fp8, fp8_w8a8_linear, 0.06)):
            err = rel_error(fn(x, qw.codes, qw.scale.reshape(-1)), x.float() @ w.T)
            report.check("kernels", f"W8A8 {name} vs bf16 matmul, M={m}", err < bound,
                         f"rel err {err:.1e}")


def time_attention(s: Settings, report: Report, ceilings: Ceilings) -> None:
    cases = (("decode B=256 ctx 1024", [1] * 256, [1023] * 256),
             ("decode B=1 ctx 4096 (split KV)", [1], [4095]),
             ("prefill 1 x 2048", [2048], [0]))
    for name, q_lens, ctx in cases:
        time_attention_case(s, report, ceilings, name, q_lens, ctx)


def time_attention_case(s: Settings, report: Report, ceilings: Ceilings, name: str,
                        q_lens: list[int], ctx: list[int]) -> None:
    from inferlab.kernels.attention import torch_paged, triton_paged

    q, k, v, kc, vc, meta = paged_batch(q_lens, ctx, 32, 8, 128, 16, torch.bfloat16, s.device)
    t_triton = bench_ms(lambda: triton_paged.paged_attention(q, k, v, kc, vc, meta, 0.088),
                        s.device)
    t_torch = bench_ms(lambda: torch_paged.paged_attention(q, k, v, kc, vc, meta, 0.088),
                       s.device)
    sweep = {bn: bench_ms(lambda bn=bn: triton_paged.paged_attention(q, k, v, kc, vc, meta, 0.088,
                                                                     block_n=bn), s.device)
             for bn in (32, 64, 128)}
    best = min(sweep, key=sweep.get)
    report.add("attention", f"{name}: Triton (default tiles)", t_triton, "ms")
    report.add("attention", f"{name}: best block_n {best} / default", t_triton / sweep[best], "x")
    report.add("attention", f"{name}: torch path / Triton", t_torch / t_triton, "x")
    if q_lens[0] == 1:
        kv_bytes = 2 * sum(meta.seq_lens_cpu) * 8 * 128 * 2  # K and V, 8 heads x 128, bf16
        report.add("attention", f"{name}: KV read / HBM bandwidth",
                   kv_bytes / (t_triton / 1e3) / ceilings.bandwidth_bytes_per_s)
    else:
        flops = 4 * 32 * 128 * q_lens[0] * (q_lens[0] + 1) / 2  # causal QK^T and PV
        report.add("attention", f"{name}: causal FLOP / bf16 matmul rate",
                   flops / (t_triton / 1e3) / ceilings.bf16_flops_per_s)


def time_linears(s: Settings, report: Report) -> None:
    n, k = 14336, 4096  # an 8B gate (or up) projection
    linear = nn.Linear(k, n, bias=False, device=s.device, dtype=torch.bfloat16)
    layers = {name: quantized_layer(linear, name, s.device) for name in QUANT_VARIANTS}
    for m in (1, 16, 256):
        x = torch.randn(m, k, dtype=torch.bfloat16, device=s.device)
        base = bench_ms(lambda x=x: linear(x), s.device)
        report.add("linear", f"{n}x{k} bf16 F.linear, M={m}", base, "ms")
        for name, layer in layers.items():
            ms = bench_ms(lambda layer=layer, x=x: layer(x), s.device)
            report.add("linear", f"{name}, M={m}: speed-up over bf16", base / ms, "x")


def time_norm_rope(s: Settings, report: Report) -> None:
    for n in (256, 8192):
        time_norm_rope_tokens(s, report, n)


def time_norm_rope_tokens(s: Settings, report: Report, n: int) -> None:
    from inferlab.kernels.fused import torch_rms_norm, torch_rotary_embedding
    from inferlab.kernels.triton_norm_rope import rms_norm, rotary_embedding
    from inferlab.models.layers import RMSNorm

    norm = RMSNorm(4096, 1e-5).to(s.device, torch.bfloat16)
    rope = RotaryEmbedding(128, 8192, 500000.0, None).to(s.device)
    x = torch.randn(n, 4096, dtype=torch.bfloat16, device=s.device)
    res = torch.randn_like(x)
    eager = bench_ms(lambda: torch_rms_norm(x, norm.weight, 1e-5, residual=res), s.device)
    fused = bench_ms(lambda: rms_norm(x, norm.weight, 1e-5, residual=res), s.device)
    report.add("norm/rope", f"add + RMSNorm, {n} tokens: eager / fused", eager / fused, "x")
    pos = torch.randint(0, 8192, (n,), device=s.device)
    q = torch.randn(n, 32, 128, dtype=torch.bfloat16, device=s.device)
    k = torch.randn(n, 8, 128, dtype=torch.bfloat16, device=s.device)
    eager = bench_ms(lambda: torch_rotary_embedding(pos, q, k, rope.cos, rope.sin), s.device)
    fused = bench_ms(lambda: rotary_embedding(pos, q, k, rope.cos, rope.sin), s.device)
    report.add("norm/rope", f"RoPE, {n} tokens: eager / fused", eager / fused, "x")


def kernel_section(s: Settings, report: Report, ceilings: Ceilings) -> None:
    for step in (check_attention, check_norm_rope, check_quant_kernels):
        run_guarded(step, report, s, report)
    if not s.smoke:  # interpreted kernels on CPU time nothing of interest
        run_guarded(time_attention, report, s, report, ceilings)
        run_guarded(time_linears, report, s, report)
        run_guarded(time_norm_rope, report, s, report)


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


# --- 3. greedy equality with transformers --------------------------------------------------------

def installed_gguf() -> str | None:
    from inferlab.errors import ModelLoadError
    from inferlab.models.loader import embedded_model_path

    try:
        path = embedded_model_path()
    except ModelLoadError:
        return None
    return path if Path(path).is_file() else None


def greedy_section(s: Settings, report: Report) -> None:
    from inferlab.models.loader import load_model

    gguf = s.embedded_gguf or installed_gguf()
    if gguf:
        loaded = load_model(gguf, torch.float32, s.device)
        label = "embedded SmolLM2-135M (GGUF)"
        prompts = [loaded.tokenizer.encode(t) for t in (
            "The capital of France is", "def fibonacci(n):", "Once upon a time,",
            "The three laws of thermodynamics state")]
    else:
        loaded = random_model(TINY if s.device.type == "cpu" else SMOLLM_135M, torch.float32,
                              s.device)
        label = "random SmolLM2-135M-shaped model (no GGUF here)"
        prompts = random_workload(4, (5, 40), (1, 1), loaded.config.vocab_size, 7).prompts
    work = Workload(prompts, [s.greedy_tokens] * len(prompts))
    engine = make_engine(loaded, "float32", s.device, 2**28, 16, 1024)
    ours = list(run_engine(engine, work, s.device).outputs.values())
    _, theirs = run_transformers(hf_twin(loaded.model), work, s.device, batch=1)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    report.check("greedy", f"{label}, fp32: engine == transformers generate", same == len(ours),
                 f"{same}/{len(ours)} prompts x {s.greedy_tokens} tokens identical")


# --- 4. the 8B-shaped model -----------------------------------------------------------------------

def cost_of(cfg: ModelConfig, fmt: str) -> ModelCost:
    weights = weight_bytes(cfg, weight_format(fmt))
    memory = plan_memory(cfg, weights, MemoryConfig(device_memory_bytes=2**40))
    return model_cost(cfg, weights, weight_format(fmt), memory, tp=1)


def decode_ms_per_token(run: Run) -> float:
    """Mean time of the steps after the first (the prefill step, which samples token 1)."""
    ends = run.step_end_s
    return (ends[-1] - ends[0]) / (len(ends) - 1) * 1e3


def single_stream(engine: LLMEngine, s: Settings, vocab: int) -> Run:
    work = random_workload(1, (s.single_prompt, s.single_prompt),
                           (s.single_output, s.single_output), vocab, 1)
    return run_engine(engine, work, s.device)


def warm_up(engine: LLMEngine, s: Settings, vocab: int) -> None:
    """Compile kernels and fill caches and allocator pools before anything is timed."""
    run_engine(engine, random_workload(4, (16, 64), (4, 8), vocab, 99), s.device)
    run_engine(engine, random_workload(1, (8, 8), (8, 8), vocab, 98), s.device)


def roofline_section(s: Settings, report: Report, ceilings: Ceilings, loaded: LoadedModel,
                     kv_bytes: int) -> dict[str, float]:
    cfg, vocab = loaded.config, loaded.config.vocab_size
    cost = cost_of(cfg, "bf16")
    engine = make_engine(loaded, "bfloat16", s.device, kv_bytes, 256, 2048)
    warm_up(engine, s, vocab)
    single = single_stream(engine, s, vocab)
    ms = decode_ms_per_token(single)
    floor_ms = cost.weight_bytes_per_step / ceilings.bandwidth_bytes_per_s * 1e3
    report.add("8B bf16", "single-stream decode", ms, "ms/token")
    report.add("8B bf16", f"HBM roofline (weights {cost.weight_bytes_per_step / 1e9:.1f} GB)",
               floor_ms, "ms/token")
    report.target("8B bf16", "single-stream decode >= 75% of HBM roofline", floor_ms / ms >= 0.75,
                 f"{floor_ms / ms:.0%}")
    work = random_workload(s.num_requests, s.prompt_range, s.output_range, vocab, 2)
    run = run_engine(engine, work, s.device)
    prompt_tokens = sum(len(p) for p in work.prompts)
    tokens_in = prompt_tokens + run.output_tokens - len(work.prompts)  # tokens through the model
    contexts = sum(sum(range(len(p) + n - 1)) for p, n in zip(work.prompts, work.output_lens,
                                                                strict=True))
    matmul = tokens_in * cost.matmul_flops_per_token / run.elapsed_s
    attention = contexts * cost.attention_flops_per_context_token / run.elapsed_s
    tag = f"{s.num_requests} concurrent"
    report.add("8B bf16", f"{tag}: output throughput", run.output_tokens / run.elapsed_s, "tok/s")
    report.add("8B bf16", f"{tag}: prompt + output tokens", tokens_in / run.elapsed_s, "tok/s")
    report.add("8B bf16", f"{tag}: linear FLOP / bf16 matmul rate", matmul / ceilings.bf16_flops_per_s)
    report.add("8B bf16", f"{tag}: + attention FLOP / bf16 matmul rate",
               (matmul + attention) / ceilings.bf16_flops_per_s)
    sub = work.subset(s.hf_requests)
    ours = run_engine(engine, sub, s.device)
    del engine
    eager = make_engine(loaded, "bfloat16", s.device, 2**30, 256, 2048, enforce_eager=True)
    warm_up(eager, s, vocab)
    eager_ms = decode_ms_per_token(single_stream(eager, s, vocab))
    del eager
    report.add("8B bf16", "single-stream decode without CUDA graphs", eager_ms, "ms/token")
    report.add("8B bf16", "CUDA graphs' single-stream speed-up", eager_ms / ms, "x")
    return {"single_ms": ms, "ours_256_tok_s": run.output_tokens / run.elapsed_s,
            "ours_sub_tok_s": ours.output_tokens / ours.elapsed_s, "sub_outputs": ours.outputs}


def transformers_section(s: Settings, report: Report, loaded: LoadedModel,
                         figures: dict) -> None:
    work = random_workload(s.num_requests, s.prompt_range, s.output_range,
                           loaded.config.vocab_size, 2).subset(s.hf_requests)
    hf = hf_twin(loaded.model)
    run_transformers(hf, Workload(work.prompts[:2], [4, 4]), s.device, 2)  # warm-up
    elapsed, outputs = run_transformers(hf, work, s.device, batch=s.hf_requests)
    hf_tok_s = sum(work.output_lens) / elapsed
    n = s.hf_requests
    report.add("vs HF", f"transformers generate, {n} requests in one static batch", hf_tok_s,
               "useful output tok/s")
    report.add("vs HF", f"engine, the same {n} requests", figures["ours_sub_tok_s"], "tok/s")
    ratio_same = figures["ours_sub_tok_s"] / hf_tok_s
    ratio_256 = figures["ours_256_tok_s"] / hf_tok_s
    report.add("vs HF", f"engine / transformers, same {n} requests", ratio_same, "x")
    report.target("vs HF", f"engine at {s.num_requests} concurrent / transformers >= 10x",
                 ratio_256 >= 10, f"{ratio_256:.1f}x")
    ours = list(figures["sub_outputs"].values())
    first = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), len(x))
             for x, y in zip(ours, outputs, strict=True)]
    report.add("vs HF", "bf16 greedy tokens equal before the first difference (median)",
               float(statistics.median(first)), "tokens")


# --- 5. quantized decode --------------------------------------------------------------------------

# name -> (scheme, planner weight format for its roofline); layers built as the product builds
# them (inferlab.quant.linear: on a GPU, torch._scaled_mm / torch._int_mm and the Triton W4A16)
QUANT_VARIANTS = {"W8A8 int8": ("W8A8", "int8"), "FP8_DYNAMIC": ("FP8_DYNAMIC", "fp8"),
                  "W4A16 g128": ("W4A16", "int4-g128")}


def quantized_layer_from(qw, scheme: str, bias: torch.Tensor | None,
                         device: torch.device) -> nn.Module:
    from inferlab.quant.linear import build_quant_linear
    from inferlab.quant.scheme import FLOAT, INT, ActivationArgs

    activations = {"W8A8": ActivationArgs(INT), "FP8_DYNAMIC": ActivationArgs(FLOAT)}.get(scheme)
    return build_quant_linear(qw, activations, bias, torch.bfloat16, device)


def quantized_layer(linear: nn.Linear, name: str, device: torch.device) -> nn.Module:
    scheme = QUANT_VARIANTS[name][0]
    return quantized_layer_from(rtn(linear.weight.detach(), scheme), scheme, linear.bias, device)


BLOCK_LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
                 ("mlp", "down_proj"))


def swap_linears(model: LlamaForCausalLM, name: str, device: torch.device
                 ) -> list[tuple[nn.Module, str, nn.Module]]:
    """Quantize every block linear in place (lm_head stays bf16); returns what to restore."""
    swapped = []
    for layer in model.model.layers:
        for owner_name, attr in BLOCK_LINEARS:
            owner = getattr(layer, owner_name)
            original = getattr(owner, attr)
            setattr(owner, attr, quantized_layer(original, name, device))
            swapped.append((owner, attr, original))
    return swapped


def quant_section(s: Settings, report: Report, ceilings: Ceilings, loaded: LoadedModel,
                  kv_bytes: int) -> None:
    cfg = loaded.config
    batch_work = random_workload(s.quant_batch, (s.single_prompt, s.single_prompt),
                                 (s.single_output, s.single_output), cfg.vocab_size, 3)
    base: tuple[float, float] | None = None
    for name in ("bf16", *QUANT_VARIANTS):
        swapped = swap_linears(loaded.model, name, s.device) if name != "bf16" else []
        try:
            engine = make_engine(loaded, "bfloat16", s.device, kv_bytes, s.quant_batch, 2048)
            warm_up(engine, s, cfg.vocab_size)
            single = decode_ms_per_token(single_stream(engine, s, cfg.vocab_size))
            batched = decode_ms_per_token(run_engine(engine, batch_work, s.device))
            del engine
        finally:
            for owner, attr, original in swapped:
                setattr(owner, attr, original)
            del swapped
        fmt = QUANT_VARIANTS[name][1] if name != "bf16" else "bf16"
        floor = cost_of(cfg, fmt).weight_bytes_per_step / ceilings.bandwidth_bytes_per_s * 1e3
        report.add("quantized", f"{name}: single-stream decode", single, "ms/token")
        report.add("quantized", f"{name}: single stream / {fmt} HBM roofline", floor / single)
        report.add("quantized", f"{name}: decode step at batch {s.quant_batch}", batched, "ms")
        if base is None:
            base = (single, batched)
        else:
            report.add("quantized", f"{name}: decode speed-up over bf16, batch 1",
                       base[0] / single, "x")
            report.add("quantized", f"{name}: decode speed-up over bf16, batch {s.quant_batch}",
                       base[1] / batched, "x")


# --- the run ---------------------------------------------------------------------------------------

def header(s: Settings) -> None:
    import inferlab.models.llama as llama

    name = torch.cuda.get_device_name() if s.device.type == "cuda" else "CPU (smoke run)"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    print(f"device {name}; torch {torch.__version__}; triton {triton_version}; "
          f"model attention path: {llama.paged_attention.__module__}", flush=True)


def kv_budget(s: Settings, reserve_bytes: int, cap_bytes: int) -> int:
    if s.device.type != "cuda":
        return 2**26
    free, _ = torch.cuda.mem_get_info()
    return max(2**30, min(cap_bytes, free - reserve_bytes))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="run every step on CPU with a tiny model (checks the script only)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--hf-requests", type=int, default=64,
                        help="requests both engines run for the transformers comparison")
    parser.add_argument("--embedded-gguf", help="the embedded model's GGUF file, if not installed")
    parser.add_argument("--skip", nargs="*", default=[], choices=("kernels", "greedy", "8b", "hf",
                                                                 "quant"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: benchmarks/gpu.py measures GPU figures and has nothing to do here "
              "(--smoke runs it on CPU with a tiny model, to check the script itself)")
        return 0
    s = settings_from(args)
    report = Report(smoke=s.smoke)
    header(s)
    ceilings = measure_ceilings(s, report)
    if "kernels" not in args.skip:
        kernel_section(s, report, ceilings)
    if "greedy" not in args.skip:
        run_guarded(greedy_section, report, s, report)
    loaded = random_model(s.model, torch.bfloat16, s.device)
    figures: dict = {}
    if "8b" not in args.skip:
        kv = kv_budget(s, reserve_bytes=16 * 2**30, cap_bytes=72 * 2**30)
        run_guarded(lambda: figures.update(roofline_section(s, report, ceilings, loaded, kv)),
                    report)
    if figures and "hf" not in args.skip:
        run_guarded(transformers_section, report, s, report, loaded, figures)
    if "quant" not in args.skip:
        run_guarded(quant_section, report, s, report, ceilings, loaded,
                    kv_budget(s, reserve_bytes=32 * 2**30, cap_bytes=8 * 2**30))
    print(f"\n{len(report.failures)} failed check(s)" + "".join(f"\n  {f}" for f in report.failures))
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(), indent=1))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
