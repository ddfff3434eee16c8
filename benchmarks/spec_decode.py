"""Speculative decoding with n-gram drafts, single stream: inferlab with and without drafts, and
transformers `generate` with and without its prompt lookup (the same idea), side by side.

Two workloads, each a few prompts one at a time, greedy, same dtype, rounds interleaved (this
machine's speed moves from minute to minute):
- copy: a chat request to repeat a WikiText-2 paragraph word for word, answered until the
  model's end token (max 128): the output is grounded in the prompt, where n-grams find drafts;
- continue: a raw WikiText-2 passage continued for 128 tokens (ignore_eos), where they seldom do.

Prints output tokens/s for each, the ratios, the drafts' acceptance, whether inferlab's tokens
with drafts equal its tokens without (they must: verification is lossless), and the fraction of
the single-stream roofline (one token a step reading every weight at the measured bandwidth;
drafts kept let a stream pass it).

Then, unless --skip-served, the same through HTTP: two `inferlab serve`, with drafts and
without, each driven in turn by `inferlab bench` at one stream on issue 8's workload W (~300-token
WikiText prompts, 128 tokens, ignore_eos), greedy (--extra-body '{"temperature": 0}').

    .venv/bin/python benchmarks/spec_decode.py [--dtype bfloat16] [--rounds 3] [--k 4] [--skip-served]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from cpu_serving import bench, free_port, serving
from offline_throughput import load_transformers
from workloads import (
    announced_roofline,
    bytes_read_per_decode_step,
    exit_on_sigterm,
    positive_int,
    rounds_text,
    script_parser,
    wikitext_prompts,
)

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams


def workloads(llm: LLM, count: int, round_index: int) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    tokenizer = llm.tokenizer
    offset = 5000 + round_index * count * 420
    paragraphs = [tokenizer.decode(ids) for ids in wikitext_prompts(tokenizer, count, 120, offset)]
    copy = [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Repeat the following text word for word.\n\n" + text}],
        add_generation_prompt=True), add_special_tokens=False) for text in paragraphs]
    cont = wikitext_prompts(tokenizer, count, 300, offset + count * 120)
    return {"copy": (copy, SamplingParams(temperature=0, max_tokens=128)),
            "continue": (cont, SamplingParams(temperature=0, max_tokens=128, ignore_eos=True))}


def run_inferlab(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    outputs = []
    start = time.perf_counter()
    for ids in prompts:  # one stream
        outputs.append(llm.generate(ids, params, use_tqdm=False)[0].outputs[0].token_ids)
    return time.perf_counter() - start, outputs


def run_transformers(model, prompts: list[list[int]], params: SamplingParams, lookup: int | None,
                     eos: int | None) -> tuple[float, list]:
    outputs = []
    start = time.perf_counter()
    for ids in prompts:
        never = model.config.vocab_size - 1
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=params.max_tokens,
                                 eos_token_id=never if params.ignore_eos else eos, pad_token_id=never,
                                 prompt_lookup_num_tokens=lookup)
        outputs.append(out[0, len(ids):].tolist())
    return time.perf_counter() - start, outputs


def served(args: argparse.Namespace, speculative: str) -> None:
    """Two servers, with drafts and without, benched in turn at one stream, greedy."""
    ports = {"plain": free_port(), "ngram": free_port()}
    common = ("--kv-cache-memory", "512MiB")
    results: dict[str, list[dict]] = {"plain": [], "ngram": []}
    # nested: a failure or Ctrl-C while the second starts stops the first
    with (serving(ports["plain"], args.dtype, 1, extra=common),
          serving(ports["ngram"], args.dtype, 1, extra=(*common, "--speculative-config", speculative)),
          tempfile.TemporaryDirectory() as tmp):
        for r in range(args.rounds):
            for name, port in ports.items():
                results[name].append(bench(port, 1, 8, Path(tmp) / f"{name}{r}.json",
                                           ("--extra-body", '{"temperature": 0}')))
    print("served, one stream, greedy (workload W through inferlab bench):")
    for name, runs in results.items():
        print(f"  {name:6s} {statistics.median(r['output_tok_s'] for r in runs):6.1f} output tok/s, "
              f"ITL p50 {statistics.median(r['itl_p50_ms'] for r in runs):.2f} ms "
              f"(rounds {rounds_text([r['output_tok_s'] for r in runs], '.1f')})")
    ratios = [a["output_tok_s"] / b["output_tok_s"] for a, b in zip(results["ngram"], results["plain"], strict=True)]
    print(f"  RATIO served ngram / plain: {statistics.median(ratios):.2f}x "
          f"(rounds {rounds_text(ratios, '.2f')})")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--prompts", type=positive_int, default=4)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--k", type=positive_int, default=4,
                        help="num_speculative_tokens (and transformers' prompt_lookup_num_tokens)")
    parser.add_argument("--lookup-max", type=positive_int, default=3, help="prompt_lookup_max")
    parser.add_argument("--lookup-min", type=positive_int, default=1, help="prompt_lookup_min")
    parser.add_argument("--skip-served", action="store_true")
    args = parser.parse_args()
    if args.lookup_min > args.lookup_max:
        parser.error(f"argument --lookup-min: at most --lookup-max ({args.lookup_max}), "
                     f"got {args.lookup_min}")
    exit_on_sigterm()
    bandwidth, _ = announced_roofline(args.dtype, args.rounds)
    speculative = {"num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
                   "prompt_lookup_min": args.lookup_min}
    plain = LLM(dtype=args.dtype)
    drafting = LLM(loaded=plain.engine.loaded, dtype=args.dtype, speculative_config=speculative)
    hf = load_transformers(plain, getattr(torch, args.dtype))
    eos = plain.engine.generation.eos_token_id
    roofline_tok_s = bandwidth / bytes_read_per_decode_step(plain.engine.loaded.model)
    systems = ("inferlab", "inferlab ngram", "transformers", "transformers prompt lookup")
    rates: dict[tuple[str, str], list[float]] = {}
    same: dict[str, list[str]] = {}
    for r in range(args.rounds):
        for name, (prompts, params) in workloads(plain, args.prompts, r).items():
            counters = drafting.engine.spec_counters
            before = (counters.num_accepted_tokens, counters.num_draft_tokens)
            runs = {"inferlab": run_inferlab(plain, prompts, params),
                    "inferlab ngram": run_inferlab(drafting, prompts, params),
                    "transformers": run_transformers(hf, prompts, params, None, eos),
                    "transformers prompt lookup": run_transformers(hf, prompts, params, args.k, eos)}
            for system, (seconds, outputs) in runs.items():
                rates.setdefault((name, system), []).append(sum(map(len, outputs)) / seconds)
            accepted = counters.num_accepted_tokens - before[0]
            drafts = counters.num_draft_tokens - before[1]
            rates.setdefault((name, "acceptance"), []).append(accepted / max(drafts, 1))
            equal = sum(a == b for a, b in zip(runs["inferlab"][1], runs["inferlab ngram"][1], strict=True))
            same.setdefault(name, []).append(f"{equal}/{len(prompts)}")
    print(f"single-stream roofline: {roofline_tok_s:.1f} tok/s (one token a step, every weight read)")
    for name in ("copy", "continue"):
        print(f"{name}:")
        for system in systems:
            values = rates[(name, system)]
            rate = statistics.median(values)
            print(f"  {system:28s} {rate:6.1f} output tok/s (rounds {rounds_text(values, '.1f')}), "
                  f"{rate / roofline_tok_s:.0%} of the roofline")
        print(f"  drafts accepted: {statistics.median(rates[(name, 'acceptance')]):.0%} "
              f"(rounds {rounds_text(rates[(name, 'acceptance')], '.0%')}); "
              f"inferlab's tokens equal with and without drafts: {' / '.join(same[name])} prompts")
        for ours, theirs in (("inferlab ngram", "inferlab"), ("inferlab ngram", "transformers prompt lookup"),
                             ("inferlab", "transformers")):
            ratios = [a / b for a, b in zip(rates[(name, ours)], rates[(name, theirs)], strict=True)]
            print(f"  RATIO {ours} / {theirs}: {statistics.median(ratios):.2f}x "
                  f"(rounds {rounds_text(ratios, '.2f')})")
    if not args.skip_served:
        del plain, drafting, hf  # the servers load their own
        served(args, json.dumps(speculative))


if __name__ == "__main__":
    main()
