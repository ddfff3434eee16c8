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
from inferlab.quant.recipe import DATA_FREE_METHODS, METHOD_FLAGS, METHODS, Recipe
from inferlab.quant.scheme import DEFAULT_GROUP_SIZE, GROUP_SIZED_SCHEMES
from inferlab.shared_data import WIKITEXT_VALID

# quantize_to_directory's calibration arguments, by argparse dest (--num-samples: num_samples)
CALIBRATION_DEFAULTS = {"calib": str(WIKITEXT_VALID), "num_samples": 128, "seq_len": 512,
                        "batch_size": 8, "seed": 0}
CALIBRATING_METHODS = " or ".join(m for m in METHODS if m not in DATA_FREE_METHODS)
# what calibrates: the flags above are refused for anything else
CALIBRATING_RUNS = (f"--method {CALIBRATING_METHODS}, or --scheme FP8, whose input scales are "
                    f"calibrated")


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
    calib = p.add_argument_group("calibration", f"for runs that calibrate ({CALIBRATING_RUNS}); "
                                 "refused elsewhere")
    # defaults None, so a flag given to a run that calibrates nothing is told from one left out
    default = CALIBRATION_DEFAULTS
    calib.add_argument("--calib", default=None,
                       help=f"calibration text file (default: {default['calib']})")
    calib.add_argument("--num-samples", type=int, default=None,
                       help=f"windows (default {default['num_samples']})")
    calib.add_argument("--seq-len", type=int, default=None,
                       help=f"tokens per window (default {default['seq_len']})")
    calib.add_argument("--batch-size", type=int, default=None,
                       help=f"windows per forward pass (default {default['batch_size']})")
    calib.add_argument("--seed", type=int, default=None,
                       help=f"window offsets' seed (default {default['seed']})")
    algo = p.add_argument_group("algorithms")
    algo.add_argument("--sink-weight", type=float, default=None,
                      help="GPTQ/SparseGPT Hessian weight of each calibration window's first "
                           "token, the attention sink (default: --seq-len)")
    algo.add_argument("--block-size", type=int, default=None,
                      help="GPTQ/SparseGPT column block (default 128)")
    algo.add_argument("--dampening", type=float, default=None,
                      help="GPTQ/SparseGPT Hessian damping (default 0.01)")
    algo.add_argument("--act-order", action=argparse.BooleanOptionalAction, default=None,
                      help="GPTQ: process columns by decreasing Hessian diagonal, recorded as "
                           "actorder \"static\" in config.json (default: on for gptq and "
                           "smoothquant, off for sparsegpt, whose 2:4 groups it would break)")
    algo.add_argument("--awq-grid", type=int, default=None, help="AWQ scale grid points (default 20)")
    algo.add_argument("--awq-clip", action="store_true", default=None,
                      help="AWQ: also search clipping ratios")
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
                  awq=AwqConfig(**_given(grid=args.awq_grid, clip=args.awq_clip)),
                  **_given(smoothquant_alpha=args.smoothquant_alpha, sink_weight=args.sink_weight))


def _check_method_flags(args: argparse.Namespace, method: str) -> None:
    """A flag of another method was once taken without a word and did nothing."""
    for dest, methods in METHOD_FLAGS.items():
        value = getattr(args, dest)
        if value is not None and method not in methods:
            raise InferlabError(f"{_flag(dest, value)} applies to --method {' or '.join(methods)}, "
                                f"not {method}")


def _flag(dest: str, value: object = True) -> str:
    """The flag as given: --act-order or --no-act-order."""
    return f"--{'no-' if value is False else ''}{dest.replace('_', '-')}"


def _calibration(args: argparse.Namespace, recipe: Recipe) -> dict[str, object]:
    """quantize_to_directory's calibration arguments, defaults for those not given; refused
    where the recipe calibrates nothing, where they once did nothing without a word."""
    given = {dest: getattr(args, dest) for dest in CALIBRATION_DEFAULTS
             if getattr(args, dest) is not None}
    if given and not recipe.needs_calibration:
        scheme = f" with --scheme {recipe.scheme.name}" if recipe.scheme is not None else ""
        raise InferlabError(f"{_flag(next(iter(given)))} applies to runs that calibrate "
                            f"({CALIBRATING_RUNS}), not --method {recipe.method}{scheme}")
    settings = CALIBRATION_DEFAULTS | given
    for dest in ("num_samples", "seq_len", "batch_size"):  # now, not once the model has loaded
        if settings[dest] < 1:
            raise InferlabError(f"{_flag(dest)} must be at least 1, got {settings[dest]}")
    if recipe.needs_calibration:
        from inferlab.quant.calibration import read_text

        read_text(settings["calib"])  # a missing file fails now, not after loading the model
    return settings


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
    calibration = _calibration(args, recipe)
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
    summary = quantize_to_directory(args.model, recipe, args.out, **calibration,
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
