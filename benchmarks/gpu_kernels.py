"""Section 2 of benchmarks/gpu.py: every GPU kernel against its torch reference, then timed
against the torch path; and the quantized layers the later sections swap in."""

from __future__ import annotations

import math

import torch
from gpu_report import Ceilings, Report, Settings, bench_ms, rel_error, run_guarded
from torch import nn

from inferlab.models.layers import RotaryEmbedding


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

    # the interpreter runs a program a row in Python: 11 s at the GPU's sizes
    tokens, hidden, (hq, hkv) = (12, 256, (4, 2)) if s.smoke else (300, 4096, (32, 8))
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=s.device)
    res = torch.randn_like(x)
    norm = RMSNorm(hidden, 1e-5).to(s.device, torch.bfloat16)
    norm.weight.data.uniform_(0.5, 1.5)
    out, new_res = rms_norm(x, norm.weight, 1e-5, residual=res)
    err = max(rel_error(out, torch_rms_norm(x + res, norm.weight, 1e-5)), rel_error(new_res, x + res))
    exact = "residual bit-exact" if torch.equal(new_res, x + res) else "residual rounded differently"
    report.check("kernels", "fused add + RMSNorm bf16", err < 1e-2, f"rel err {err:.1e}, {exact}")
    rope = RotaryEmbedding(128, 4096, 500000.0, None).to(s.device)
    pos = torch.randint(0, 4096, (tokens,), device=s.device)
    q = torch.randn(tokens, hq, 128, dtype=torch.bfloat16, device=s.device)
    k = torch.randn(tokens, hkv, 128, dtype=torch.bfloat16, device=s.device)
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


if __name__ == "__main__":
    raise SystemExit("a section of benchmarks/gpu.py, not a script: run benchmarks/gpu.py --help")
