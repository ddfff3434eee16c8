"""Offline throughput: inferlab's engine vs transformers `generate` (static batches), side by side.

64 prompts of 256 tokens from the WikiText-2 test text, 128 output tokens each (ignore_eos), same
dtype. Then the same 64 requests behind a shared 512-token system prompt, prefix caching on vs off.
Prints ratios and the fraction of this machine's roofline reached for prefill and decode.

    .venv/bin/python benchmarks/offline_throughput.py [--dtype bfloat16] [--requests 64]
"""

from __future__ import annotations

import argparse
import time

import torch
from workloads import (
    bytes_read_per_decode_step,
    machine_roofline,
    matmul_flops_per_token,
    wikitext_prompts,
)

from inferlab.engine.llm_engine import LLM
from inferlab.engine.sampling_params import SamplingParams


def run_inferlab(llm: LLM, prompts: list[list[int]], output_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    roof = machine_roofline()
    bandwidth, peak = roof["memory_bandwidth_bytes_per_s"], roof["peak_flops"]["bf16" if dtype == torch.bfloat16 else "fp32"]
    print(f"machine: {roof['cpu']}, {roof['threads']} threads, {bandwidth / 1e9:.1f} GB/s, "
          f"{peak / 1e12:.2f} TFLOP/s ({args.dtype} matmul)")

    llm = LLM(dtype=args.dtype, kv_cache_memory="3GiB", max_num_seqs=args.requests)
    model = llm.engine.loaded.model
    prompts = wikitext_prompts(llm.tokenizer, args.requests, args.prompt_tokens)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm up

    n_out = args.requests * args.output_tokens
    prefill_s = run_inferlab(llm, prompts, 1)
    total_s = run_inferlab(llm, [p[::-1] for p in prompts], args.output_tokens)  # fresh: no cache hits
    prefill_tps = args.requests * args.prompt_tokens / prefill_s
    decode_tps = (n_out - args.requests) / max(total_s - prefill_s, 1e-9)
    flops_per_token = matmul_flops_per_token(llm.engine.model_config)
    print(f"inferlab: {n_out / total_s:.1f} output tok/s ({total_s:.1f} s for {args.requests} requests)")
    print(f"  prefill {prefill_tps:.0f} tok/s = {prefill_tps * flops_per_token / peak:.0%} of the matmul roofline")
    step_floor_s = bytes_read_per_decode_step(model) / bandwidth
    print(f"  decode {decode_tps:.0f} tok/s at batch {args.requests}; weights-read floor per step "
          f"{step_floor_s * 1e3:.1f} ms -> {args.requests / step_floor_s:.0f} tok/s bound")

    if not args.skip_transformers:
        import os

        from transformers import AutoModelForCausalLM
        path = llm.engine.loaded.path
        hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                  dtype=dtype).eval()
        hf_s = run_transformers(hf, prompts, args.output_tokens, 16, llm.tokenizer.eos_token_id)
        print(f"transformers generate (static batches of 16): {n_out / hf_s:.1f} output tok/s ({hf_s:.1f} s)")
        print(f"RATIO inferlab / transformers: {hf_s / total_s:.2f}x")
        del hf

    system = wikitext_prompts(llm.tokenizer, 1, 512, offset=args.requests * args.prompt_tokens)[0]
    shared = [system + p for p in prompts]
    times = {}
    for caching in (True, False):
        cached = LLM(loaded=llm.engine.loaded, dtype=args.dtype, kv_cache_memory="3GiB",
                     max_num_seqs=args.requests, enable_prefix_caching=caching)
        times[caching] = run_inferlab(cached, shared, args.output_tokens)
        print(f"shared 512-token system prompt, prefix caching {'on' if caching else 'off'}: "
              f"{n_out / times[caching]:.1f} output tok/s ({times[caching]:.1f} s)")
    print(f"RATIO caching on / off: {times[False] / times[True]:.2f}x")


if __name__ == "__main__":
    main()
