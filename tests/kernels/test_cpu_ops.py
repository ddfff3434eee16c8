"""The C kernels outside attention (inferlab/kernels/cpu/ops.c, sampling.c) against transformers'
Llama functions and torch, in fp32 and bf16: RMS norm, rotary, SiLU-and-mul, argmax and sampling,
bad layouts refused, the torch path without the library, and the OpenMP thread release. Paged
attention and the KV cache write are test_cpu_attention's."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama import modeling_llama as hf

from inferlab.engine.sampler import inverse_cdf
from inferlab.kernels import cpu_ops, fused
from inferlab.models.layers import RotaryEmbedding

pytestmark = pytest.mark.skipif(not cpu_ops.available(torch.zeros(1)),
                                reason="no C compiler: the CPU kernels could not be built")

DTYPES = [torch.float32, torch.bfloat16]


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    norm = hf.LlamaRMSNorm(x.shape[-1], eps=eps).to(x.dtype)
    norm.weight.data.copy_(weight)
    return norm(x)


def assert_rounding_close(ours: torch.Tensor, ref: torch.Tensor, bf16_ulps: int) -> None:
    """fp32: equal up to summation order and FMA contraction (1e-6 of the tensor's scale).
    bf16: at most `bf16_ulps` units in the last place apart, element by element."""
    assert ours.dtype == ref.dtype
    if ours.dtype == torch.float32:
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * float(ref.detach().abs().max()))
        return
    ulp = ref.float().abs() * torch.finfo(torch.bfloat16).eps
    assert bool(((ours.float() - ref.float()).abs() <= bf16_ulps * ulp).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 5, 300])
def test_rms_norm_matches_transformers(dtype, rows):
    torch.manual_seed(rows)
    x = torch.randn(rows, 576, dtype=dtype) * 3
    weight = (torch.rand(576) + 0.5).to(dtype)
    ours = cpu_ops.rms_norm(x, weight, 1e-5)
    ref = hf_rms_norm(x, weight, 1e-5)
    # bf16: HF rounds twice (after normalising, after the weight), and the fp32 sum of squares
    # may differ in its last bit with the summation order
    assert_rounding_close(ours, ref, bf16_ulps=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_residual_rms_norm_adds_then_normalises(dtype):
    torch.manual_seed(1)
    x, residual = torch.randn(7, 1000, dtype=dtype), torch.randn(7, 1000, dtype=dtype)
    weight = (torch.rand(1000) + 0.5).to(dtype)
    summed = x + residual  # torch's rounding of the residual add
    ref = hf_rms_norm(summed, weight, 1e-6)
    out, new_residual = cpu_ops.rms_norm(x.clone(), weight, 1e-6, residual.clone())
    assert torch.equal(new_residual, summed)
    assert_rounding_close(out, ref, bf16_ulps=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused_qk", [True, False])
def test_rotary_matches_transformers(dtype, fused_qk):
    torch.manual_seed(2)
    n, hq, hkv, d = 11, 9, 3, 64
    rope = RotaryEmbedding(d, 4096, 100000.0, None)
    positions = torch.randint(0, 4096, (n,))
    qkv = torch.randn(n, (hq + 2 * hkv) * d, dtype=dtype)
    q = qkv[:, :hq * d].view(n, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].view(n, hkv, d)
    if not fused_qk:  # separate tensors, as after Qwen3's q/k norms
        q, k = q.clone(), k.clone()
    cos, sin = rope.cos[positions][None], rope.sin[positions][None]  # [1, N, D] fp32
    q_ref, k_ref = hf.apply_rotary_pos_emb(q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
                                           cos, sin)
    v_before = qkv[:, (hq + hkv) * d:].clone()
    cpu_ops.rotary_embedding(positions, q, k, rope.cos, rope.sin)
    for ours, ref in ((q, q_ref), (k, k_ref)):
        ref = ref[0].transpose(0, 1).to(dtype)  # fp32 math, one rounding
        assert_rounding_close(ours, ref, bf16_ulps=1)
    assert torch.equal(qkv[:, (hq + hkv) * d:], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "width"), [(6, 1536), (64, 1536), (3, 36)])
def test_silu_and_mul_matches_the_mlp_activation(dtype, rows, width):
    # 1536: the vector paths (AVX2 fp32, AVX512-BF16), 64 rows of them threaded; 36: the loop
    torch.manual_seed(3)
    gate_up = torch.randn(rows, 2 * width, dtype=dtype) * 8  # wide range: exp's far tails too
    gate_up[0, :4] = torch.tensor([0.0, -0.0, 100.0, -30.0])  # both zeros, sigmoids near 1 and 0
    gate, up = gate_up.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    assert_rounding_close(cpu_ops.silu_and_mul(gate_up), ref, bf16_ulps=1)


def test_bad_layouts_are_refused():
    q = torch.randn(2, 9, 64)
    cache = torch.zeros(4, 12, 3, 64)  # block size 12: not a power of two
    with pytest.raises(ValueError, match="power-of-two"):
        cpu_ops.paged_decode_attention(q, cache, cache, torch.zeros(2, 1, dtype=torch.int32),
                                       torch.ones(2, dtype=torch.int32),
                                       torch.zeros(1, dtype=torch.int32),
                                       torch.zeros(1, dtype=torch.int32), 0.1, torch.empty_like(q))
    with pytest.raises(ValueError, match="head dim"):
        odd = torch.randn(2, 9, 63)
        cpu_ops.rotary_embedding(torch.zeros(2, dtype=torch.int64), odd, odd, torch.zeros(8, 63),
                                 torch.zeros(8, 63))


def test_without_the_library_the_torch_path_runs(monkeypatch):
    x, weight = torch.randn(3, 64), torch.rand(64)
    with_c = fused.rms_norm(x, weight, 1e-5)
    monkeypatch.setattr(cpu_ops, "_library", lambda: None)
    assert not cpu_ops.available(x)
    torch.testing.assert_close(fused.rms_norm(x, weight, 1e-5), with_c, atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not cpu_ops.available(torch.zeros(1)), reason="no C compiler here")
def test_argmax_matches_torch_and_takes_the_first_of_ties() -> None:
    gen = torch.Generator().manual_seed(0)
    for shape in [(64, 49152), (1, 49152), (3, 17), (5, 16), (2, 1003)]:
        x = torch.randn(shape, generator=gen)
        assert torch.equal(cpu_ops.argmax(x), x.argmax(-1)), shape
    x = torch.zeros(5, 1000)
    x[1, 5] = x[1, 900] = 2.0  # a tie across vector lanes: the first
    x[2] = float("-inf")  # every value the same: index 0, as torch
    x[3, 999] = 1.0  # in the scalar tail
    x[4, 17] = x[4, 1] = 3.0  # a tie inside the first 16 and beyond
    assert cpu_ops.argmax(x).tolist() == [0, 5, 0, 999, 1]
    assert cpu_ops.argmax(x[:, :500]).tolist() == [0, 5, 0, 0, 1]  # a strided view's rows



def test_sample_lands_where_the_running_mass_passes_the_draw() -> None:
    """Mass 0.5 at id 10 (first block of 256), 0.3 at 300 (second), 0.2 at 599 (third, a
    short one); every other logit -inf. Worked by hand: each draw u picks the first id whose
    running mass exceeds u (draws kept off the boundaries: the weights come through exp), and
    the total need not be 1."""
    logits = torch.full((1, 600), float("-inf"))
    logits[0, 10], logits[0, 300], logits[0, 599] = math.log(1.5), math.log(0.9), math.log(0.6)
    cases = {0.0: 10, 0.49: 10, 0.51: 300, 0.79: 300, 0.81: 599, 1 - 1e-12: 599, 1 - 1e-16: 599}
    for u, expected in cases.items():
        picked = cpu_ops.sample(logits, [1.0], [0.0], torch.tensor([[u]], dtype=torch.float64))
        assert picked.tolist() == [expected], u


def test_sample_temperature_and_min_p_by_hand() -> None:
    """Probabilities 0.6, 0.3, 0.1 on a grid of 6,000 evenly spaced draws: the counts are the
    masses times 6,000. At temperature 0.5 they become 0.36 : 0.09 : 0.01 (squared, then
    normalized by 0.46); min_p 0.2 drops 0.1 (below 0.2 * 0.6) and leaves 2 : 1."""
    draws = 6000
    logits = torch.tensor([0.6, 0.3, 0.1]).log().repeat(draws, 1)
    uniform = ((torch.arange(draws, dtype=torch.float64) + 0.5) / draws)[:, None]
    cases = [(1.0, 0.0, [0.6, 0.3, 0.1]), (0.5, 0.0, [0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46]),
             (1.0, 0.2, [2 / 3, 1 / 3, 0.0])]
    for temperature, min_p, masses in cases:
        tokens = cpu_ops.sample(logits, [temperature] * draws, [min_p] * draws, uniform)
        counts = torch.bincount(tokens, minlength=3).tolist()
        assert all(abs(c - m * draws) <= 1 for c, m in zip(counts, masses, strict=True)), counts


def test_sample_matches_the_torch_inverse_cdf() -> None:
    """Against softmax and sampler.inverse_cdf in torch on the same draws: the same tokens,
    short of a draw landing within rounding of a boundary."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 49152, generator=gen) * 4
    uniform = torch.rand(64, 1, dtype=torch.float64, generator=gen)
    for temperature, min_p in [(1.0, 0.0), (0.7, 0.0), (1.0, 0.05)]:
        probs = torch.softmax(logits / temperature, dim=-1)
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        expected = inverse_cdf(probs, uniform)
        got = cpu_ops.sample(logits, [temperature] * 64, [min_p] * 64, uniform)
        assert (got == expected).sum() >= 63, (temperature, min_p)
        assert torch.equal(cpu_ops.sample(logits[5:6], [temperature], [min_p], uniform[5:6]), got[5:6])


RELEASE_PROBE = """
import os, time, torch
from inferlab.kernels import cpu_ops
threads = lambda: len(os.listdir("/proc/self/task"))
cpu_ops.release_openmp_threads()
before = threads()
torch.ones(1 << 24).sum()  # a parallel region on this thread: its pool's workers start
with_pool = threads()
released = cpu_ops.release_openmp_threads()
deadline = time.monotonic() + 5  # a released worker is told to end; it leaves /proc soon after
while threads() > before and time.monotonic() < deadline:
    time.sleep(0.01)
print(torch.get_num_threads(), before, with_pool, threads(), released)
"""


@pytest.mark.skipif(torch.get_num_threads() < 2 or not os.path.isdir("/proc/self/task"),
                    reason="needs two OpenMP threads and Linux's /proc")
def test_release_openmp_threads_ends_the_callers_workers() -> None:
    """A fresh process, so no other test's threads come and go while it counts."""
    probe = subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True,
                           check=True, timeout=120)
    num_threads, before, with_pool, after, released = probe.stdout.split()
    assert int(with_pool) == int(before) + int(num_threads) - 1
    assert released == "True" and int(after) == int(before)
