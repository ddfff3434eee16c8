"""The C paged attention (inferlab/kernels/cpu/decode_attention.c) and KV cache write (ops.c)
against the torch paged-attention oracle, in fp32 and bf16: mixed batches, block sizes, head
layouts, long prefill chunks, and the bit-for-bit agreements the engine's batching relies on. The
other C kernels are test_cpu_ops's."""

from __future__ import annotations

import random

import pytest
import torch

from inferlab.kernels import cpu_ops
from inferlab.kernels.attention import cpu_paged, torch_paged
from inferlab.kernels.attention.metadata import AttentionMetadata
from tests.kernels.test_cpu_ops import DTYPES

pytestmark = pytest.mark.skipif(not cpu_ops.available(torch.zeros(1)),
                                reason="no C compiler: the CPU kernels could not be built")


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


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.bfloat16, 1.6e-2), (torch.float32, 5e-6)])
def test_a_few_tokens_through_the_whole_team_in_turn_match_the_oracle(dtype, tolerance):
    """Three tokens of a one-KV-head model: too few (token, KV head) tasks for two threads, so
    the team takes them one after another in a shared scratch (decode_together), each waiting
    for the one before; fp32 (attend_together_f32) gives each token the bits of the one-head
    tasks of a batch large enough for them (the same token among 12 copies of the batch)."""
    query_lens, context_lens = [1] * 3, [300, 77, 140]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, dtype, seed=11,
                                              d=64, heads=(16, 1))
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    ref = torch_paged.paged_attention(q, k, v, kc.clone(), vc.clone(), meta, 0.125)
    torch.testing.assert_close(together, ref, atol=tolerance, rtol=tolerance)
    if dtype == torch.float32:
        many = [i % 3 for i in range(12)]
        tables = [meta.block_tables[b, : -(-meta.seq_lens_cpu[b] // 16)].tolist() for b in many]
        many_meta = AttentionMetadata.build([1] * 12, [meta.seq_lens_cpu[b] for b in many], tables, 16)
        apart = cpu_paged.paged_attention(q[many], k[many], v[many], kc, vc, many_meta, 0.125)
        assert torch.equal(apart[:3], together)


def test_decode_result_does_not_depend_on_the_batch():
    query_lens, context_lens = [1] * 8, [5, 77, 300, 16, 1, 64, 200, 33]
    (q, k, v), (kc, vc), meta = _random_batch(query_lens, context_lens, torch.bfloat16, seed=5)
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, 0.125)
    for b in range(len(query_lens)):
        table = meta.block_tables[b, : -(-meta.seq_lens_cpu[b] // 16)].tolist()
        alone_meta = AttentionMetadata.build([1], [meta.seq_lens_cpu[b]], [table], 16)
        alone = cpu_paged.paged_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], kc, vc, alone_meta, 0.125)
        assert torch.equal(alone[0], together[b])


@pytest.mark.parametrize("head_dim, block_size, heads", [(64, 16, (9, 3)), (128, 16, (9, 3)),
                                                         (64, 8, (4, 4)), (80, 16, (14, 2)),
                                                         (128, 32, (9, 3)), (36, 16, (9, 3))])
def test_fp32_decodes_match_the_oracle_and_the_bits_alone(head_dim, block_size, heads):
    """fp32 decodes (the AVX2 register kernels where the CPU has them, for head dims a multiple
    of 8: 64 and 128 as constants, 80 not; 36 the generic loops) over contexts that end inside a
    block, within a first block and across blocks smaller than the 16-position value chunks;
    GQA groups of 3, 1 and 7 (register tiles of 3 + 3 + 1 rows). Against the oracle, and each
    token alone giving the bits it gives among 12 (all its heads a task): alone, the whole team
    takes it where its KV heads are fewer than twice the threads (attend_together_f32), else a
    KV head a task."""
    context_lens = [5, 77, 300, 16, 1, 140, 33, 64, 200, 15, 129, 48]
    (q, k, v), (kc, vc), meta = _random_batch([1] * len(context_lens), context_lens, torch.float32,
                                              seed=13, d=head_dim, heads=heads, block_size=block_size)
    kc.mul_(4)  # scores spread as a model's do, so the softmax weights are far from uniform
    together = cpu_paged.paged_attention(q, k, v, kc, vc, meta, head_dim ** -0.5)
    ref = torch_paged.paged_attention(q, k, v, kc.clone(), vc.clone(), meta, head_dim ** -0.5)
    # scores spread this wide, the generic loops were up to 3.1e-6 off too (one exp's error)
    torch.testing.assert_close(together, ref, atol=5e-6, rtol=5e-6)
    for b, context in enumerate(context_lens):
        table = meta.block_tables[b, : -(-(context + 1) // block_size)].tolist()
        alone_meta = AttentionMetadata.build([1], [context + 1], [table], block_size)
        alone = cpu_paged.paged_attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], kc, vc, alone_meta,
                                          head_dim ** -0.5)
        assert torch.equal(alone[0], together[b]), b


@pytest.mark.parametrize("head_dim, block_size, heads", [(64, 16, (9, 3)), (128, 8, (9, 3)),
                                                         (64, 32, (40, 2))])
def test_a_prefill_row_gives_the_bits_of_the_same_token_decoded(head_dim, block_size, heads):
    """Each new token of a bf16 prefill chunk against a decode step of that token over the same
    positions: the same bits (where the C prefill kernel runs: without AVX512-BF16, bf16
    prefills take torch's attention, which promises no such thing). Chunked prefill, preemption (a recomputed output) and speculative
    drafts run a token through one kernel or the other depending on the rest of the batch, and
    a seeded sample must not. Without AMX, before the prefill summed its scores as decode does,
    about one chunk in fifty differed in some head (keys scaled up, so scores spread as a
    model's do); with AMX, before decode ran on tiles too, every chunk did."""
    if not cpu_ops.prefill_head_dim_fits(head_dim):
        pytest.skip("no C prefill attention kernel here")
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
