"""Paged attention on CPU: the C kernels (inferlab/kernels/cpu/decode_attention.c for decode,
decode_amx.c on CPUs with AMX; prefill_attention.c on AMX or AVX512-BF16 register tiles for
prefill) beside torch's SDPA path
(inferlab/kernels/attention/torch_paged.py), one layer of the embedded model's shape (9 query
heads, 3 KV heads, head dim 64, bf16), on the same paged cache in one run.

Prefill: fresh prompts (causal, no cached positions) and prompt chunks after cached positions (a
prefix-cache hit, or the second chunk of a long prompt), where torch needs a boolean mask.
Decode: one new token per sequence over its cached positions (blocks in table order, as a fresh
engine hands them out), and 64 sequences that share their first 512 positions' blocks (the C
kernel's shared-prefix path: the prefix read once for all 64 tokens). With `--layers 30` each
decode case cycles through 30 layers' caches, as a decode step of the embedded model does, so
that its keys and values come from memory rather than the caches.

    .venv/bin/python benchmarks/attention.py [--rounds 5] [--layers 1]
"""

from __future__ import annotations

import torch
from workloads import positive_int, script_parser

from inferlab.kernels import cpu_ops
from inferlab.kernels.attention import torch_paged
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.timing import best_seconds

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
CASES = {  # name -> (sequences, new tokens each, cached positions before them)
    "8 fresh prompts of 256 tokens": (8, 256, 0),
    "3 fresh prompts of 768 tokens": (3, 768, 0),
    "8 chunks of 256 after 512 cached": (8, 256, 512),
    "4 chunks of 512 after 256 cached": (4, 512, 256),
}


def run_case(seqs: int, new: int, context: int, rounds: int) -> tuple[float, float, float]:
    """(C seconds, torch seconds, max |difference|) for one layer's prefill attention."""
    total = new + context
    blocks = -(-total // BLOCK)
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = (torch.randn(seqs * blocks + 1, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
                        .to(torch.bfloat16) for _ in range(2))
    tables = [list(range(1 + i * blocks, 1 + (i + 1) * blocks)) for i in range(seqs)]
    meta = AttentionMetadata.build([new] * seqs, [total] * seqs, tables, BLOCK)
    q = torch.randn(seqs * new, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    ours, theirs = torch.empty_like(q), torch.empty_like(q)
    every = torch.arange(seqs, dtype=torch.int32)
    c_s = best_seconds(lambda: cpu_ops.paged_prefill_attention(
        q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, every, 0.125,
        ours), rounds)
    torch_s = best_seconds(lambda: torch_paged.prefill_attention(q, k_cache, v_cache, meta, 0.125,
                                                                 theirs), rounds)
    return c_s, torch_s, (ours.float() - theirs.float()).abs().max().item()


DECODE_CASES = {  # name -> (sequences, cached positions each, shared leading positions)
    "decode 64 x 300 positions": (64, 300, 0),
    "decode 64 x 830, 512 of them shared": (64, 830, 512),
    "decode 1 x 1000 positions": (1, 1000, 0),
}


def run_decode_case(seqs: int, positions: int, shared: int, rounds: int,
                    layers: int) -> tuple[float, float, float]:
    """(C seconds, torch seconds, max |difference|) for one layer's decode attention: the mean
    over `layers` layers' caches called in turn, as a decode step calls them (with 30, the
    embedded model's, they no longer fit the caches and come from memory)."""
    blocks, shared_blocks = -(-positions // BLOCK), shared // BLOCK
    gen = torch.Generator().manual_seed(1)
    pool = seqs * (blocks - shared_blocks) + shared_blocks + 1
    caches = [tuple(torch.randn(pool, BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
                    for _ in range(2)) for _ in range(layers)]
    own = blocks - shared_blocks
    tables = [list(range(1, 1 + shared_blocks))
              + list(range(1 + shared_blocks + i * own, 1 + shared_blocks + (i + 1) * own)) for i in range(seqs)]
    meta = AttentionMetadata.build([1] * seqs, [positions] * seqs, tables, BLOCK)
    q = torch.randn(seqs, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    ours, theirs = torch.empty_like(q), torch.empty_like(q)
    rows = torch.arange(seqs, dtype=torch.int32)

    def ours_step() -> None:
        for k_cache, v_cache in caches:
            cpu_ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                           rows, rows, 0.125, ours)

    def torch_step() -> None:
        for k_cache, v_cache in caches:
            torch_paged._decode(q, k_cache, v_cache, meta, 0.125, meta.decode_seqs, theirs)

    c_s, torch_s = best_seconds(ours_step, rounds) / layers, best_seconds(torch_step, rounds) / layers
    return c_s, torch_s, (ours.float() - theirs.float()).abs().max().item()


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--layers", type=positive_int, default=1,
                        help="decode cases: layers' caches called in turn (30: from memory, as in "
                             "a decode step of the embedded model)")
    args = parser.parse_args()
    probe = torch.zeros(1, HEADS, HEAD_DIM, dtype=torch.bfloat16)
    if not cpu_ops.prefill_attention_fits(probe, torch.zeros(1, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)):
        raise SystemExit("the C prefill attention needs a CPU with AVX512-BF16 and a C compiler")
    print(f"{torch.get_num_threads()} threads, one layer ({HEADS} heads, {KV_HEADS} KV heads, head dim {HEAD_DIM}), bf16, best of {args.rounds}; decode over {args.layers} layers' caches")
    for name, (seqs, new, context) in CASES.items():
        c_s, torch_s, diff = run_case(seqs, new, context, args.rounds)
        pairs = seqs * HEADS * new * (context + (new + 1) / 2)  # (query, key) pairs attended
        print(f"{name:36} C {c_s * 1e3:6.2f} ms ({c_s / pairs * 1e9:.2f} ns/pair)  torch {torch_s * 1e3:6.2f} ms"
              f"  RATIO {torch_s / c_s:.2f}x  max |diff| {diff:.3g}")
    for name, (seqs, positions, shared) in DECODE_CASES.items():
        c_s, torch_s, diff = run_decode_case(seqs, positions, shared, args.rounds, args.layers)
        per = c_s / (seqs * positions * KV_HEADS) * 1e9
        print(f"{name:36} C {c_s * 1e3:6.2f} ms ({per:.2f} ns/position/KV head)  torch {torch_s * 1e3:6.2f} ms"
              f"  RATIO {torch_s / c_s:.2f}x  max |diff| {diff:.3g}")


if __name__ == "__main__":
    main()
