"""Evaluator speed: direct forward vs the serving engine's prompt logprobs, side by side.

Scores the same WikiText-2 windows both ways in one run (same model, same dtype) and prints
tokens/s, the engine's cost relative to the direct path, the fraction of this machine's matmul
roofline reached, and what a full WikiText-2 test run would take at that speed.

    .venv/bin/python benchmarks/eval_speed.py [--dtype float32] [--seq-len 512] [--windows 3]
"""

from __future__ import annotations

import time

import torch
from workloads import (
    WIKITEXT,
    bounded_int,
    machine_roofline,
    positive_int,
    script_parser,
    wikitext_prompts,
)

from inferlab.eval.config import EvalConfig
from inferlab.eval.dataset import read_text
from inferlab.eval.perplexity import Setup, run_windows, window_scorer
from inferlab.models.loader import load_model


def flops_per_token(model, seq_len: int) -> float:
    """2 x the linear layers' weights, plus causal attention over seq_len / 2 keys on average."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    cfg = model.config
    attention = 4 * cfg.num_layers * (seq_len / 2) * cfg.num_heads * cfg.head_dim
    return 2 * linear + attention


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--seq-len", type=bounded_int(2), default=512,
                        help="tokens a window (a window predicts its tokens 1..L-1)")
    parser.add_argument("--windows", type=positive_int, default=3, help="timed windows each way")
    args = parser.parse_args()
    roof = machine_roofline()
    peak = roof["peak_flops"]["bf16" if args.dtype == "bfloat16" else "fp32"]
    print(f"machine: {roof['cpu']}, {roof['threads']} threads, {peak / 1e12:.2f} TFLOP/s "
          f"({args.dtype} matmul)")
    dtype = getattr(torch, args.dtype)
    loaded = load_model(None, dtype)
    windows = wikitext_prompts(loaded.tokenizer, args.windows + 1, args.seq_len)
    setup = Setup(loaded, windows[1:], dtype, torch.device("cpu"))
    per_token = flops_per_token(loaded.model, args.seq_len)

    rates = {}
    for via_engine in (False, True):
        config = EvalConfig(seq_len=args.seq_len, dtype=args.dtype, device="cpu", via_engine=via_engine)
        score = window_scorer(setup, config)
        score(windows[0])  # warm-up window, not timed
        start = time.perf_counter()
        tally = run_windows(setup.windows, score)
        rates[via_engine] = tally.tokens / (time.perf_counter() - start)
        name = "engine" if via_engine else "direct"
        print(f"{name:>7}: {rates[via_engine]:8.1f} predicted tokens/s, ppl {tally.ppl:.4f}, "
              f"{rates[via_engine] * per_token / peak:.0%} of the matmul roofline")
    print(f"engine / direct speed: {rates[True] / rates[False]:.2f}x")
    full_tokens = len(loaded.tokenizer.encode(read_text(str(WIKITEXT))))
    print(f"full WikiText-2 test ({full_tokens:,} tokens) at this speed, direct: "
          f"{full_tokens / rates[False] / 60:.1f} min")


if __name__ == "__main__":
    main()
