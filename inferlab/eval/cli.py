"""`inferlab eval [MODEL] [--baseline MODEL]`: perplexity, and KL divergence against a baseline.

As the GPTQ and AWQ papers measure it: the text is tokenized whole (a BOS token only where the
tokenizer adds one), cut into non-overlapping windows of --seq-len tokens (the partial tail
dropped), each window scored on its own; perplexity = exp(mean NLL of all predicted tokens).
"""

from __future__ import annotations

import argparse
import sys

from inferlab.eval.config import DEFAULT_DATASET, EVAL_DTYPES, EvalConfig
from inferlab.user_files import check_writable

_DEFAULTS = EvalConfig()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval", help="perplexity on a text, and KL divergence / top-1 agreement against a baseline",
        description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="HF model directory or .gguf file (default, or `embedded`: the embedded "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("--baseline", default=None, metavar="MODEL",
                   help="reference model (a directory, a .gguf file or `embedded`): report mean "
                        "and p99 KL(baseline || model) per token and top-1 agreement on the same "
                        "windows")
    p.add_argument("--dataset", default=DEFAULT_DATASET, metavar="FILE",
                   help="UTF-8 text file, tokenized whole (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=_DEFAULTS.seq_len,
                   help=f"tokens per non-overlapping window (default: {_DEFAULTS.seq_len})")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="score only the first N windows (a quick run)")
    p.add_argument("--dtype", choices=EVAL_DTYPES, default=_DEFAULTS.dtype,
                   help="weights and activations of both models (default: auto, as the engine)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=_DEFAULTS.device)
    p.add_argument("--via-engine", action="store_true",
                   help="perplexity from the serving engine's prompt logprobs instead of a direct "
                        "forward (no --baseline)")
    p.add_argument("--output", default=None, metavar="FILE", help="write the result as JSON")
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    config = EvalConfig(model=args.model, baseline=args.baseline, dataset=args.dataset,
                        seq_len=args.seq_len, limit=args.limit, dtype=args.dtype,
                        device=args.device, via_engine=args.via_engine, output=args.output)
    from inferlab.eval.perplexity import evaluate  # torch loads only once the flags are valid
    from inferlab.eval.result import not_finite_warning, render, write_json

    if config.output:
        check_writable(config.output, "--output")
    result = evaluate(config)
    try:
        if config.output:  # first: a closed or full stdout must not lose a long run's figures
            write_json(result, config.output)
    finally:  # nor a full disk: the figures are printed before its error ends the command
        warning = not_finite_warning(result)
        if warning:
            print(warning, file=sys.stderr)
        print(render(result))
    return 0
