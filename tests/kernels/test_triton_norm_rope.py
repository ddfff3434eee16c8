"""Fused RMSNorm and RoPE Triton kernels, on CPU through the interpreter, against transformers.

The interpreter truncates fp32 -> bf16 instead of rounding to nearest (a GPU rounds), so bf16
results may sit up to two bf16 ulps (2^-6 relative) from torch; fp16 rounds correctly there,
and the exact-rounding checks use fp16.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")

from inferlab.kernels.triton_norm_rope import rms_norm, rotary_embedding  # noqa: E402

GEN = torch.Generator().manual_seed(0)


def hf_norm(hidden: int, weight: torch.Tensor, eps: float) -> torch.nn.Module:
    norm = llama.LlamaRMSNorm(hidden, eps=eps)
    norm.weight.data = weight.clone()
    return norm


TOLERANCE = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 2e-2}
# CPU runs the kernels in the interpreter; where a GPU exists they also run compiled (-m gpu)
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "hidden"), [(torch.float32, 96), (torch.float16, 128),
                                               (torch.bfloat16, 128)])
def test_rms_norm_matches_transformers(dtype: torch.dtype, hidden: int, device: str) -> None:
    x = (torch.randn(3, 5, hidden, generator=GEN) * 3).to(dtype)
    weight = torch.rand(hidden, generator=GEN).to(dtype) + 0.5
    expected = hf_norm(hidden, weight, 1e-5)(x)
    out = rms_norm(x.to(device), weight.to(device), 1e-5).cpu()
    assert out.shape == x.shape and out.dtype == dtype
    # the same rounding steps as transformers; rsqrt vs 1/sqrt may move the last bit
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


def test_fused_residual_add_then_norm() -> None:
    x = torch.randn(7, 64, generator=GEN).to(torch.float16)
    residual = torch.randn(7, 64, generator=GEN).to(torch.float16)
    weight = torch.rand(64, generator=GEN).to(torch.float16)
    out, new_residual = rms_norm(x, weight, 1e-6, residual=residual)
    assert torch.equal(new_residual, x + residual)  # a 16-bit add, rounded once, like torch
    torch.testing.assert_close(out, hf_norm(64, weight, 1e-6)(x + residual), atol=1e-3, rtol=1e-3)


def random_tables(positions: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Arbitrary angles, different in each half: the kernel must assume nothing about them."""
    angles = torch.rand(positions, dim, generator=GEN) * 6.3
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rope_matches_transformers_on_strided_qkv(dtype: torch.dtype, device: str) -> None:
    n, hq, hkv, d = 6, 6, 2, 64
    qkv = torch.randn(n, hq + 2 * hkv, d, generator=GEN).to(dtype)  # one fused projection
    positions = torch.tensor([0, 5, 17, 3, 3, 30])
    cos, sin = random_tables(32, d)
    # transformers wants [batch, heads, seq, D] and cos/sin [batch, seq, D]
    q_ref, k_ref = llama.apply_rotary_pos_emb(
        qkv[:, :hq].float().transpose(0, 1)[None], qkv[:, hq:hq + hkv].float().transpose(0, 1)[None],
        cos[positions][None], sin[positions][None])
    qkv = qkv.to(device)
    q, k = qkv[:, :hq], qkv[:, hq:hq + hkv]  # strided views, rotated in place
    v_before = qkv[:, hq + hkv:].clone()
    rotary_embedding(positions.to(device), q, k, cos.to(device), sin.to(device))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(q.cpu().float(), q_ref[0].transpose(0, 1), atol=tol, rtol=tol)
    torch.testing.assert_close(k.cpu().float(), k_ref[0].transpose(0, 1), atol=tol, rtol=tol)
    assert torch.equal(qkv[:, hq + hkv:], v_before)  # v untouched


def test_rope_at_position_zero_with_llama_tables_is_identity() -> None:
    """cos(0) = 1, sin(0) = 0: position 0 must come back unchanged (a hand-checkable case)."""
    emb = llama.LlamaRotaryEmbedding(llama.LlamaConfig(hidden_size=64, num_attention_heads=1))
    cos, sin = emb(torch.zeros(1), torch.arange(4)[None])
    q = torch.randn(1, 2, 64, generator=GEN)
    k = torch.randn(1, 1, 64, generator=GEN)
    q0, k0 = q.clone(), k.clone()
    rotary_embedding(torch.tensor([0]), q, k, cos[0], sin[0])
    assert torch.equal(q, q0) and torch.equal(k, k0)


def test_an_interpreted_launch_leaves_triton_language_as_it_found_it() -> None:
    """The interpreter patches triton.language while a kernel runs and leaves behind what a
    helper called inside the kernel (tl.sum here) patched; a later CUDA compile of any kernel
    then ran those patched functions and failed (seen with an empty Triton cache)."""
    import triton.language as tl

    before = {ns: dict(vars(ns)) for ns in (tl, tl.core, tl.math, tl.core.tensor)}
    rms_norm(torch.randn(3, 64, generator=GEN), torch.ones(64), 1e-5)
    for ns, names in before.items():
        changed = [n for n, v in vars(ns).items() if names.get(n) is not v]
        assert not changed and set(vars(ns)) == set(names), (ns, changed)
