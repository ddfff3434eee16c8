"""Beam search: inferlab's LLM.beam_search vs transformers `generate(num_beams=...)`, side by side.

8 prompts of 128 tokens from the WikiText-2 test text, 4 beams of 32 tokens each, no end token
(ignore_eos here; there, an end id no beam writes), same dtype, rounds interleaved (this
machine's speed moves from minute to minute). inferlab runs each round's 32 beams as engine
requests sharing their past through the prefix cache (as vLLM does); transformers runs one
prompt at a time with its 4 beams as a batch. Prints the times, their ratio, how many prompts
got the same best beam from both, and the fraction of the roofline reached: each round at
best one decode step of 32 rows (weights and KV at the bandwidth, FLOPs at the matmul peak).

    .venv/bin/python benchmarks/beam_search.py [--dtype bfloat16] [--rounds 3]
"""

from __future__ import annotations

import statistics
import time

import torch
from offline_throughput import load_transformers
from workloads import (
    announced_roofline,
    bytes_read_per_decode_step,
    decode_step_floor_s,
    positive_int,
    rounds_text,
    script_parser,
    wikitext_prompts,
)

from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.llm import LLM


def run_inferlab(llm: LLM, prompts: list[list[int]], width: int, tokens: int) -> tuple[float, list]:
    start = time.perf_counter()
    outs = llm.beam_search(prompts, BeamSearchParams(beam_width=width, max_tokens=tokens, ignore_eos=True))
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]


def run_transformers(model, prompts: list[list[int]], width: int, tokens: int) -> tuple[float, list]:
    never = model.config.vocab_size - 1
    best = []
    start = time.perf_counter()
    for ids in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, num_beams=width, max_new_tokens=tokens,
                                 eos_token_id=never, pad_token_id=never)
        best.append(out[0, len(ids):].tolist())
    return time.perf_counter() - start, best


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompts", type=positive_int, default=8)
    parser.add_argument("--prompt-tokens", type=positive_int, default=128)
    parser.add_argument("--beam-width", type=positive_int, default=4)
    parser.add_argument("--output-tokens", type=positive_int, default=32)
    parser.add_argument("--rounds", type=positive_int, default=3)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    bandwidth, peak = announced_roofline(args.dtype, args.rounds)
    llm = LLM(dtype=args.dtype, kv_cache_memory="2GiB")
    hf = load_transformers(llm, dtype)
    ours, theirs, same = [], [], []
    for r in range(args.rounds):
        prompts = wikitext_prompts(llm.tokenizer, args.prompts, args.prompt_tokens,
                                   offset=r * args.prompts * args.prompt_tokens)
        llm.engine.scheduler.reset_prefix_cache()
        ours_s, our_best = run_inferlab(llm, prompts, args.beam_width, args.output_tokens)
        their_s, their_best = run_transformers(hf, prompts, args.beam_width, args.output_tokens)
        ours.append(ours_s)
        theirs.append(their_s)
        same.append(sum(a == b for a, b in zip(our_best, their_best, strict=True)))
    rows = args.prompts * args.beam_width
    floor_s = sum(max(decode_step_floor_s(
        llm.engine.model_config, bytes_read_per_decode_step(llm.engine.loaded.model), rows,
        args.prompt_tokens + t, dtype.itemsize, bandwidth, peak)) for t in range(args.output_tokens))
    our_s, hf_s = statistics.median(ours), statistics.median(theirs)
    print(f"inferlab beam_search: {our_s:.1f} s (rounds {rounds_text(ours, '.1f')}); "
          f"{floor_s / our_s:.0%} of the roofline ({floor_s:.2f} s: {args.output_tokens} decode steps of {rows} rows)")
    print(f"transformers generate(num_beams={args.beam_width}), one prompt at a time: {hf_s:.1f} s "
          f"(rounds {rounds_text(theirs, '.1f')})")
    print(f"same best beam: {' / '.join(f'{s}/{args.prompts}' for s in same)} prompts")
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    print(f"RATIO inferlab / transformers: {statistics.median(ratios):.2f}x "
          f"(rounds {rounds_text(ratios, '.2f')})")


if __name__ == "__main__":
    main()
