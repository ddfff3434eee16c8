"""Offline throughput: inferlab's engine vs transformers `generate` (static batches), side by side.

64 prompts of 256 tokens from the WikiText-2 test text, 128 output tokens each (ignore_eos), same
dtype. Then the same 64 requests behind a shared 512-token system prompt, prefix caching on vs off.
Prints ratios and the fraction of this machine's roofline reached for prefill (its linears' FLOPs at the
matmul peak) and decode (the larger of the weights and KV read at the bandwidth and the FLOPs at
the matmul peak, `decode_step_floor_s`).

Each comparison runs in interleaved rounds (default 3: ours, then transformers, on fresh prompts;
caching on, then off, each from an empty cache) and reports medians, because this machine's speed
moves by tens of percent from minute to minute.

    .venv/bin/python benchmarks/offline_throughput.py [--dtype bfloat16] [--requests 64] [--rounds 3]
"""

from __future__ import annotations

import statistics
import time

import torch
from workloads import (
    announced_roofline,
    bounded_int,
    bytes_read_per_decode_step,
    decode_step_floor_s,
    positive_int,
    prefill_flops_per_token,
    rounds_text,
    script_parser,
    wikitext_prompts,
)

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams


def run_inferlab(llm: LLM, prompts: list[list[int]], output_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_tokens for o in outs)
    return elapsed


def run_transformers(model, prompts: list[list[int]], output_tokens: int, batch: int, pad_id: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=output_tokens,
                                 min_new_tokens=output_tokens, pad_token_id=pad_id)
        assert out.shape[1] == width + output_tokens
    return time.perf_counter() - start


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--requests", type=positive_int, default=64)
    parser.add_argument("--prompt-tokens", type=positive_int, default=256)
    parser.add_argument("--output-tokens", type=bounded_int(2), default=128,
                        help="tokens a request (the decode rate needs one after the first)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="interleaved rounds of each comparison; medians are reported")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    bandwidth, peak = announced_roofline(args.dtype, args.rounds)

    llm = LLM(dtype=args.dtype, kv_cache_memory="3GiB", max_num_seqs=args.requests)
    model = llm.engine.loaded.model
    llm.generate(wikitext_prompts(llm.tokenizer, 2, 16), SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    hf = None if args.skip_transformers else load_transformers(llm, dtype)
    n_out = args.requests * args.output_tokens
    prompt_text = args.requests * args.prompt_tokens
    ours, theirs, prefill = [], [], []
    for r in range(args.rounds):  # each round fresh prompts (no cache hits), the same for both
        prompts = wikitext_prompts(llm.tokenizer, args.requests, args.prompt_tokens, offset=r * prompt_text)
        prefill.append(run_inferlab(llm, [p[::-1] for p in prompts], 1))
        ours.append(run_inferlab(llm, prompts, args.output_tokens))
        if hf is not None:
            theirs.append(run_transformers(hf, prompts, args.output_tokens, 16, llm.tokenizer.eos_token_id))
    total_s, prefill_s = statistics.median(ours), statistics.median(prefill)
    prefill_tps = prompt_text / prefill_s
    decode_tps = (n_out - args.requests) / max(total_s - prefill_s, 1e-9)
    flops_per_token = prefill_flops_per_token(llm.engine.model_config, args.prompt_tokens)
    print(f"inferlab: {n_out / total_s:.1f} output tok/s ({total_s:.1f} s for {args.requests} requests; "
          f"rounds {rounds_text(ours, '.1f')})")
    print(f"  prefill {prefill_tps:.0f} tok/s = {prefill_tps * flops_per_token / peak:.0%} of the matmul roofline")
    memory_s, compute_s = decode_step_floor_s(
        llm.engine.model_config, bytes_read_per_decode_step(model), args.requests,
        args.prompt_tokens + args.output_tokens // 2, dtype.itemsize, bandwidth, peak)
    step_s = args.requests / decode_tps
    print(f"  decode {decode_tps:.0f} tok/s at batch {args.requests}: {step_s * 1e3:.1f} ms a step; floor "
          f"{max(memory_s, compute_s) * 1e3:.1f} ms (weights and KV at the bandwidth {memory_s * 1e3:.1f}, "
          f"FLOPs at the matmul peak {compute_s * 1e3:.1f}) = {max(memory_s, compute_s) / step_s:.0%} of the roofline")
    if theirs:
        hf_s = statistics.median(theirs)
        print(f"transformers generate (static batches of 16): {n_out / hf_s:.1f} output tok/s "
              f"({hf_s:.1f} s; rounds {rounds_text(theirs, '.1f')})")
        ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
        print(f"RATIO inferlab / transformers: {statistics.median(ratios):.2f}x (rounds {rounds_text(ratios, '.2f')})")
        del hf

    system = wikitext_prompts(llm.tokenizer, 1, 512, offset=args.rounds * prompt_text)[0]
    shared = [system + p for p in wikitext_prompts(llm.tokenizer, args.requests, args.prompt_tokens)]
    engines = {True: llm, False: LLM(loaded=llm.engine.loaded, dtype=args.dtype, kv_cache_memory="3GiB",
                                     max_num_seqs=args.requests, enable_prefix_caching=False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for caching, engine in engines.items():
            engine.engine.scheduler.reset_prefix_cache()  # every run starts from an empty cache
            times[caching].append(run_inferlab(engine, shared, args.output_tokens))
    for caching in (True, False):
        median_s = statistics.median(times[caching])
        print(f"shared 512-token system prompt, prefix caching {'on' if caching else 'off'}: "
              f"{n_out / median_s:.1f} output tok/s ({median_s:.1f} s; rounds {rounds_text(times[caching], '.1f')})")
    ratios = [off / on for on, off in zip(times[True], times[False], strict=True)]
    print(f"RATIO caching on / off: {statistics.median(ratios):.2f}x (rounds {rounds_text(ratios, '.2f')})")


def load_transformers(llm: LLM, dtype: torch.dtype):
    import os

    from transformers import AutoModelForCausalLM

    path = llm.engine.loaded.path
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                dtype=dtype).eval()




if __name__ == "__main__":
    main()
