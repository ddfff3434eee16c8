"""`inferlab quantize [MODEL] --scheme S --method M --out DIR`: compress a model's linear layers."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time

from inferlab.config import DTYPES, check_threads
from inferlab.errors import InferlabError
from inferlab.quant.recipe import HESSIAN_METHODS, METHODS, Recipe
from inferlab.quant.scheme import DEFAULT_GROUP_SIZE, GROUP_SIZED_SCHEMES
from inferlab.shared_data import WIKITEXT_VALID


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "quantize", help="quantize/sparsify a model into a compressed-tensors checkpoint",
        description="Quantize (W8A16, W8A8, W4A16, FP8_DYNAMIC, FP8, FP8_BLOCK) and/or 2:4-sparsify the linear "
                    "layers of a model; writes a Hugging Face directory in the compressed-tensors "
                    "format (vLLM and `inferlab serve` load it). Embeddings stay dense.")
    p.add_argument("model", nargs="?", default=None,
                   help="HF model directory or .gguf file (default: the embedded model)")
    p.add_argument("--scheme", default=None,
                   help="W8A16, W8A8, W4A16, FP8_DYNAMIC, FP8 (static activation scales, calibrated) "
                        "or FP8_BLOCK (square weight blocks, activations in groups as wide)")
    p.add_argument("--method", default=None, help=f"one of {', '.join(METHODS)} (default: "
                   "sparsegpt with --sparsity, else rtn)")
    p.add_argument("--sparsity", default=None,
                   help="2:4, alone or with --scheme; done by --method sparsegpt (the default "
                        "then) or magnitude, which both imply it")
    p.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    p.add_argument("--group-size", type=int, default=None,
                   help="W4A16 inputs per scale, FP8_BLOCK's block side (default for both: 128, "
                        "which must divide every quantized linear's inputs: the embedded "
                        "model's 576 take 64); the other schemes take none")
    p.add_argument("--asymmetric", action="store_true", help="W4A16/W8A16 with zero points")
    p.add_argument("--ignore", nargs="*", default=["lm_head"],
                   help="layers left dense: HF names or 're:' regexes (default: lm_head; without "
                        "it a tied lm_head is quantized and written untied)")
    calib = p.add_argument_group("calibration")
    calib.add_argument("--calib", default=str(WIKITEXT_VALID), help="calibration text file "
                       "(default: %(default)s)")
    calib.add_argument("--num-samples", type=int, default=128, help="windows (default 128)")
    calib.add_argument("--seq-len", type=int, default=512, help="tokens per window (default 512)")
    calib.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    calib.add_argument("--seed", type=int, default=0)
    calib.add_argument("--sink-weight", type=float, default=None,
                       help="GPTQ/SparseGPT Hessian weight of each window's first token, the "
                            "attention sink (default: --seq-len)")
    algo = p.add_argument_group("algorithms")
    algo.add_argument("--block-size", type=int, default=None,
                      help="GPTQ/SparseGPT column block (default 128)")
    algo.add_argument("--dampening", type=float, default=None,
                      help="GPTQ/SparseGPT Hessian damping (default 0.01)")
    algo.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=None,
                      help="GPTQ: process columns by decreasing Hessian diagonal, recorded as "
                           "actorder \"static\" in config.json (default: on for gptq and "
                           "smoothquant, off for sparsegpt, whose 2:4 groups it would break)")
    algo.add_argument("--awq-grid", type=int, default=None, help="AWQ scale grid points (default 20)")
    algo.add_argument("--awq-clip", action="store_true", help="AWQ: also search clipping ratios")
    algo.add_argument("--smoothquant-alpha", type=float, default=None,
                      help="SmoothQuant migration strength (default 0.5)")
    p.add_argument("--dtype", default="auto", help="dtype of the dense tensors and scales: "
                   "auto (the source's), float32, bfloat16, float16")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_quantize)


def build_recipe(args: argparse.Namespace) -> Recipe:
    """Every flag checked before the model is loaded, so bad input fails at once."""
    from inferlab.quant.algorithms.awq import AwqConfig
    from inferlab.quant.algorithms.obs import ObsConfig
    from inferlab.quant.recipe import default_method
    from inferlab.quant.scheme import make_scheme

    scheme = None
    if args.scheme is not None:
        scheme = make_scheme(args.scheme, _group_size(args), args.asymmetric)
    elif args.asymmetric or args.group_size is not None:
        raise InferlabError(f"{'--asymmetric' if args.asymmetric else '--group-size'} needs a --scheme")
    method = default_method(args.sparsity) if args.method is None else args.method.lower()
    _check_method_flags(args, method)
    act_order = method in ("gptq", "smoothquant") if args.act_order is None else args.act_order
    return Recipe(scheme=scheme, method=method, sparsity=args.sparsity,
                  ignore=tuple(args.ignore),
                  obs=ObsConfig(**_given(block_size=args.block_size, damp=args.dampening),
                                act_order=act_order),
                  awq=AwqConfig(**_given(grid=args.awq_grid), clip=args.awq_clip),
                  **_given(smoothquant_alpha=args.smoothquant_alpha, sink_weight=args.sink_weight))


_METHOD_FLAGS = (  # flag, its argparse dest, the methods that read it
    ("--block-size", "block_size", HESSIAN_METHODS), ("--dampening", "dampening", HESSIAN_METHODS),
    ("--act-order", "act_order", HESSIAN_METHODS), ("--sink-weight", "sink_weight", HESSIAN_METHODS),
    ("--awq-grid", "awq_grid", ("awq",)), ("--awq-clip", "awq_clip", ("awq",)),
    ("--smoothquant-alpha", "smoothquant_alpha", ("smoothquant",)),
)


def _check_method_flags(args: argparse.Namespace, method: str) -> None:
    """A flag of another method was once taken without a word and did nothing."""
    for flag, dest, methods in _METHOD_FLAGS:
        if getattr(args, dest) not in (None, False) and method not in methods:
            raise InferlabError(f"{flag} applies to --method {' or '.join(methods)}, not {method}")


def _given(**values: object) -> dict[str, object]:
    """The values a user gave: the rest keep their config's defaults."""
    return {name: value for name, value in values.items() if value is not None}


def _group_size(args: argparse.Namespace) -> int:
    if args.group_size is None:
        return DEFAULT_GROUP_SIZE
    if args.scheme.upper() not in GROUP_SIZED_SCHEMES:  # once ignored without a word
        raise InferlabError(f"--group-size applies to {' and '.join(GROUP_SIZED_SCHEMES)}; "
                            f"{args.scheme} has one scale per output channel or tensor")
    if args.group_size <= 0:
        raise InferlabError(f"--group-size must be positive, got {args.group_size}")
    return args.group_size


def run_quantize(args: argparse.Namespace) -> int:
    recipe = build_recipe(args)
    if args.dtype not in DTYPES:
        raise InferlabError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if recipe.needs_calibration:
        from inferlab.quant.calibration import read_text

        read_text(args.calib)  # a missing file fails now, not after loading the model
    if args.batch_size < 1:
        raise InferlabError(f"--batch-size must be at least 1, got {args.batch_size}")
    _check_out(args.out)
    if args.threads is not None:
        check_threads("--threads", args.threads)
        import torch

        torch.set_num_threads(args.threads)
    from inferlab.quant.run import quantize_to_directory

    # SIGTERM (kill, a job scheduler) as an exception, as Ctrl-C is one: the half-written
    # out.partial-PID is removed on the way out, where the bare signal left it behind
    signal.signal(signal.SIGTERM, _exit_on_signal)
    started = time.perf_counter()
    summary = quantize_to_directory(args.model, recipe, args.out, calib=args.calib,
                                    num_samples=args.num_samples, seq_len=args.seq_len,
                                    batch_size=args.batch_size, seed=args.seed,
                                    dense_dtype=args.dtype, progress=not args.quiet)
    summary["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary, indent=2), file=sys.stdout)
    return 0


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _check_out(out: str) -> None:
    """Fail now, not after the quantization, where --out cannot be made: the checkpoint is
    written beside it (out.partial-PID) and moved into place, so it must be new or an empty
    directory other than the working one, and its nearest existing ancestor must take a new
    directory."""
    if not out.strip():
        raise InferlabError("--out is empty: name the directory to write")
    if os.path.islink(out):  # the checkpoint is moved into place: a link would be replaced, or fail
        raise InferlabError(f"{out}: is a symbolic link (name the directory itself, or a new --out)")
    if os.path.exists(out) and not os.path.isdir(out):
        raise InferlabError(f"{out}: is a file, not a directory (choose a new --out)")
    if os.path.exists(out) and os.listdir(out):
        raise InferlabError(f"{out}: exists and is not empty (choose a new --out)")
    if os.path.realpath(out) in (os.path.realpath(os.getcwd()), "/"):
        raise InferlabError(f"{out}: the working directory cannot be replaced (choose a new --out)")
    from inferlab.quant.export import missing_parents

    missing = missing_parents(out)
    parent = os.path.dirname(missing[-1] if missing else os.path.abspath(out))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".inferlab-probe-", dir=parent))
    except OSError as e:
        raise InferlabError(f"{out}: cannot write a directory in {parent} ({e.strerror})") from None
