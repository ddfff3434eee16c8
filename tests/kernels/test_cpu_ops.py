"""The C kernels (inferlab/kernels/cpu/ops.c, decode_attention.c) against transformers' Llama
functions and the torch paged-attention oracle, in fp32 and bf16."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama import modeling_llama as hf

from inferlab.engine.sampler import inverse_cdf
from inferlab.kernels import cpu_ops, fused
from inferlab.kernels.attention import cpu_paged, torch_paged
from inferlab.kernels.attention.metadata import AttentionMetadata
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
def test_silu_and_mul_matches_the_mlp_activation(dtype):
    torch.manual_seed(3)
    gate_up = torch.randn(6, 2 * 1536, dtype=dtype) * 8  # wide range: exp's far tails too
    gate, up = gate_up.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    assert_rounding_close(cpu_ops.silu_and_mul(gate_up), ref, bf16_ulps=1)


def _random_batch(query_lens: list[int], context_lens: list[int], dtype: torch.dtype, seed: int,
                  d: int = 64, heads: tuple[int, int] = (9, 3), block_size: int = 16):
    """Caches filled at random, shuffled block tables, new tokens after each context; heads:
    (query heads, KV heads)."""
    hq, hkv = heads
    gen = random.Random(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    need = [-(-s // block_size) for s in seq_lens]
    pool = list(range(sum(need) + 2))
    gen.shuffle(pool)
    tables, start = [], 0
    for n in need:
        tables.append(pool[start:start + n])
        start += n
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    torch.manual_seed(seed)
    shape = (len(pool), block_size, hkv, d)
    caches = torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype)
    n = sum(query_lens)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, dtype=dtype)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    return (q.view(n, hq, d), k.view(n, hkv, d), v.view(n, hkv, d)), caches, meta


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 96, 80])  # bf16 80: the kernel's generic loops
def test_mixed_batch_matches_the_torch_oracle(dtype, head_dim):
    """Decodes (C kernel) and prefill chunks (SDPA) in one batch, as the engine sends them."""
    query_lens, context_lens = [1, 7, 1, 1, 20, 1], [40, 0, 3, 130, 17, 0]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, dtype, seed=4, d=head_dim)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    ours = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    ref = torch_paged.paged_attention(q, k, v, kc_ref, vc_ref, meta, 0.125)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)  # same KV writes
    tol = 2e-6 if dtype == torch.float32 else 1.6e-2  # bf16: one rounding of the output
    torch.testing.assert_close(ours, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("block_size", [4, 8, 32])
def test_decodes_over_other_block_sizes_match_the_oracle(block_size):
    """bf16 decodes, one alone (the whole team on one token) and five together, over blocks
    smaller than the kernel's 16-position chunks (a chunk spans blocks) and larger."""
    for query_lens, context_lens in [([1], [300]), ([1] * 5, [5, 77, 300, 16, 140])]:
        (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, torch.bfloat16, seed=8,
                                                  block_size=block_size)
        ours = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
        ref = torch_paged.paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
        torch.testing.assert_close(ours, ref, atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_long_prefill_chunks_match_the_oracle_alone_or_together(head_dim):
    """Prompt chunks of several query tiles after cached positions (bf16: the AMX prefill
    kernel where the CPU has it): the oracle's result, and the same bits alone or batched."""
    query_lens, context_lens = [70, 1, 33, 130], [200, 50, 0, 17]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, torch.bfloat16, seed=6, d=head_dim)
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    ref = torch_paged.paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
    torch.testing.assert_close(together, ref, atol=1.6e-2, rtol=1.6e-2)
    starts = meta.query_start_loc.tolist()
    for b, n in enumerate(query_lens):
        table = meta.block_tables[b, : -(-meta.seq_lens_cpu[b] // 16)].tolist()
        alone_meta = AttentionMetadata.build([n], [meta.seq_lens_cpu[b]], [table], 16)
        rows = slice(starts[b], starts[b] + n)
        alone = cpu_paged.paged_attention(q[rows], k[rows], v[rows], kc, vc, alone_meta, 0.125)
        assert torch.equal(alone, together[rows])


@pytest.mark.parametrize("heads", [(32, 8), (4, 4), (16, 1), (6, 3), (40, 2)])
def test_decode_head_layouts_match_the_oracle_alone_or_together(heads):
    """bf16 decodes with GQA groups of 4, 1, 16, 2 and 20 (on AMX: a KV head's query heads are
    the columns of one tile, 20 of them two bands): the oracle's result, and the same bits alone
    (one KV head a task) or batched (all heads)."""
    query_lens, context_lens = [1] * 6, [5, 77, 300, 16, 1, 140]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, torch.bfloat16, seed=7,
                                              d=128, heads=heads)
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    ref = torch_paged.paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
    torch.testing.assert_close(together, ref, atol=1.6e-2, rtol=1.6e-2)
    for b in range(len(query_lens)):
        table = meta.block_tables[b, : -(-meta.seq_lens_cpu[b] // 16)].tolist()
        alone_meta = AttentionMetadata.build([1], [meta.seq_lens_cpu[b]], [table], 16)
        alone = cpu_paged.paged_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], kc, vc, alone_meta, 0.125)
        assert torch.equal(alone[0], together[b])


def test_a_few_tokens_through_the_whole_team_in_turn_match_the_oracle():
    """Three tokens of a one-KV-head model: too few (token, KV head) tasks for two threads, so
    the team takes them one after another in a shared scratch (decode_together), each waiting
    for the one before."""
    query_lens, context_lens = [1] * 3, [300, 77, 140]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, torch.bfloat16, seed=11,
                                              d=64, heads=(16, 1))
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    ref = torch_paged.paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
    torch.testing.assert_close(together, ref, atol=1.6e-2, rtol=1.6e-2)


def test_decode_result_does_not_depend_on_the_batch():
    query_lens, context_lens = [1] * 8, [5, 77, 300, 16, 1, 64, 200, 33]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, torch.bfloat16, seed=5)
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    for b in range(len(query_lens)):
        table = meta.block_tables[b, : -(-meta.seq_lens_cpu[b] // 16)].tolist()
        alone_meta = AttentionMetadata.build([1], [meta.seq_lens_cpu[b]], [table], 16)
        alone = cpu_paged.paged_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], kc, vc, alone_meta, 0.125)
        assert torch.equal(alone[0], together[b])


@pytest.mark.parametrize("head_dim, block_size, heads", [(64, 16, (9, 3)), (128, 8, (9, 3)),
                                                         (64, 32, (40, 2))])
def test_a_prefill_row_gives_the_bits_of_the_same_token_decoded(head_dim, block_size, heads):
    """Each new token of a bf16 prefill chunk against a decode step of that token over the same
    positions: the same bits. Chunked prefill, preemption (a recomputed output) and speculative
    drafts run a token through one kernel or the other depending on the rest of the batch, and
    a seeded sample must not. Without AMX, before the prefill summed its scores as decode does,
    about one chunk in fifty differed in some head (keys scaled up, so scores spread as a
    model's do); with AMX, before decode ran on tiles too, every chunk did."""
    gen = random.Random(11)
    for trial in range(30):
        new, context = gen.randint(2, 40), gen.randint(0, 90)
        (q, k, v), (kc, vc), meta = _random_batch([new], [context], torch.bfloat16, seed=trial,
                                                  d=head_dim, heads=heads, block_size=block_size)
        kc.mul_(gen.uniform(1, 8))
        chunk = cpu_paged.paged_attention(q, k, v, kc, vc, meta, head_dim ** -0.5)
        table = meta.block_tables[0].tolist()
        for r in range(new):
            step = AttentionMetadata.build([1], [context + r + 1], [table], block_size)
            decoded = cpu_paged.paged_attention(q[r:r + 1], k[r:r + 1], v[r:r + 1], kc, vc, step,
                                                head_dim ** -0.5)
            assert torch.equal(decoded[0], chunk[r]), (trial, new, context, r)


@pytest.mark.parametrize("block_size, head_dim, heads", [(16, 64, (9, 3)), (8, 128, (32, 8)),
                                                         (32, 64, (4, 4)), (16, 96, (14, 2))])
def test_decodes_sharing_a_prompt_give_the_bits_each_gives_alone(block_size, head_dim, heads):
    """24 bf16 decodes whose first 96 positions are the same blocks (a shared system prompt:
    decode_with_prefix's cascade path, on machines of up to 12 threads) against the oracle, and
    each token alone (the per-token path) giving the same bits. One more sequence shares only
    the first 48 positions: with it, the batch shares too little and takes the per-token path.
    Head dims 64 and 128 take the kernels' constant-size loops, 96 their general ones; GQA
    groups of 3, 4, 1 and 7."""
    hq, hkv = heads
    gen = random.Random(3)
    shared_blocks = 96 // block_size
    own = [gen.randint(1, 150) for _ in range(25)]
    next_block = iter(range(1000))
    prompt = [next(next_block) for _ in range(shared_blocks)]
    tables = [prompt + [next(next_block) for _ in range(-(-n // block_size))] for n in own]
    tables[-1] = prompt[: shared_blocks // 2] + [next(next_block) for _ in range(-(-(96 + own[-1]) // block_size) - shared_blocks // 2)]
    seq_lens = [96 + n for n in own]
    torch.manual_seed(9)
    shape = (next(next_block), block_size, hkv, head_dim)
    kc, vc = torch.randn(shape, dtype=torch.bfloat16), torch.randn(shape, dtype=torch.bfloat16)
    qkv = torch.randn(25, (hq + 2 * hkv) * head_dim, dtype=torch.bfloat16)
    q, k, v = (x.reshape(25, -1, head_dim) for x in qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], 1))
    for count in (24, 25):
        meta = AttentionMetadata.build([1] * count, seq_lens[:count], tables[:count], block_size)
        together = cpu_paged.paged_attention(q[:count], k[:count], v[:count], kc, vc, meta, 0.125)
        ref = torch_paged.paged_attention(q[:count], k[:count], v[:count], kc.clone(), vc.clone(), meta, 0.125)
        torch.testing.assert_close(together, ref, atol=1.6e-2, rtol=1.6e-2)
        for b in range(count):
            alone_meta = AttentionMetadata.build([1], [seq_lens[b]], [tables[b]], block_size)
            alone = cpu_paged.paged_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], kc, vc, alone_meta, 0.125)
            assert torch.equal(alone[0], together[b]), (count, b)


@pytest.mark.parametrize("write_kv", [cpu_ops.write_kv, torch_paged.write_kv], ids=["C", "torch"])
def test_cache_write_skips_negative_slots(write_kv) -> None:
    """Padding rows of a fixed-size batch (slot -1) write nothing; the real row lands at its
    slot (block 1, offset 2 of 4-token blocks)."""
    k_storage, v_storage = torch.zeros(3, 4, 1, 16), torch.zeros(3, 4, 1, 16)
    k_cache, v_cache = k_storage[1:], v_storage[1:]  # slot -1 would land in block 0 of storage
    k = torch.arange(32, dtype=torch.float32).reshape(2, 1, 16) + 1
    write_kv(k, -k, k_cache, v_cache, torch.tensor([-1, 6]))
    assert torch.equal(k_cache[1, 2, 0], k[1, 0]) and torch.equal(v_cache[1, 2, 0], -k[1, 0])
    assert k_storage.count_nonzero() == 16 and v_storage.count_nonzero() == 16


def test_a_prompt_of_many_tokens_lands_at_its_slots():
    """600 tokens (a prompt's chunk: the C copy splits them over the threads), scattered over
    the blocks, every tenth one padding: each real token's K and V at its slot, nothing else
    written, as torch's index_copy places them."""
    gen = torch.Generator().manual_seed(12)
    k, v = (torch.randn(600, 3, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
    slots = torch.randperm(64 * 16, generator=gen)[:600]
    slots[::10] = -1
    ours = [torch.zeros(64, 16, 3, 64, dtype=torch.bfloat16) for _ in range(2)]
    ref = [torch.zeros_like(cache) for cache in ours]
    cpu_ops.write_kv(k, v, ours[0], ours[1], slots)
    torch_paged.write_kv(k, v, ref[0], ref[1], slots)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])
    assert ours[0].view(-1, 3, 64)[slots[slots >= 0]].equal(k[slots >= 0])
    assert ours[0].view(-1, 192).abs().sum(dim=1).count_nonzero() == 540


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
