"""Engine options on the command line, named as vLLM names them; defaults come from EngineConfig."""

from __future__ import annotations

import argparse
import re

from inferlab.config import (
    BINARY_SUFFIXES,
    DECIMAL_SUFFIXES,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DTYPE_ALIASES,
    DTYPES,
    EngineConfig,
    parse_bytes,
)
from inferlab.engine.request_queue import SCHEDULING_POLICIES
from inferlab.engine.spec_decode import SpeculativeConfig
from inferlab.errors import InferlabError
from inferlab.models.model_path import resolve_model_path

_DEFAULTS = EngineConfig()
# The server's default step: prefill in chunks of this many tokens between decode steps. When
# many requests arrive together, their first tokens come out in that order, a few every step,
# instead of all after the whole burst. 16 streams of 300-token prompts on the first sessions'
# Intel CPU: TTFT p50 2.5 s at 2048, 1.1 s at 512, 0.9 s at 256. On the AMD EPYC of the twelfth
# session, against 512: 768 gave 3% more output at 64 streams and TTFT p50 at 16 streams
# 394 -> 497 ms; 1024 gave 5% more and 613 ms (BENCHMARKS.md). The offline commands keep
# EngineConfig's larger step.
SERVING_MAX_NUM_BATCHED_TOKENS = 768


def add_engine_args(parser: argparse.ArgumentParser, serving: bool = False) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="HF model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    group = parser.add_argument_group("engine")
    group.add_argument("--dtype", choices=(*DTYPES, *DTYPE_ALIASES), default=_DEFAULTS.dtype)
    group.add_argument("--device", choices=("auto", "cpu", "cuda"), default=_DEFAULTS.device)
    group.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", dest="kv_cache_memory",
                       default=None,
                       help="bytes for the KV cache, e.g. 2GiB, 512MiB (default: 2GiB on a CPU; "
                            "on a GPU what --gpu-memory-utilization leaves; "
                            "--kv-cache-memory-bytes as newer vLLM names it)")
    group.add_argument("--gpu-memory-utilization", type=float,
                       default=_DEFAULTS.gpu_memory_utilization,
                       help="share of the GPU's memory for weights, activations and the KV cache, "
                            "sized after a profiling step (default: %(default)s; ignored on a CPU)")
    group.add_argument("--enforce-eager", action="store_true",
                       help="run decode steps eagerly, without CUDA graphs")
    group.add_argument("--block-size", type=int, default=_DEFAULTS.block_size,
                       help="tokens a KV-cache block holds (default: %(default)s)")
    group.add_argument("--max-num-seqs", type=int, default=_DEFAULTS.max_num_seqs,
                       help="sequences a step runs at most (default: %(default)s)")
    step = SERVING_MAX_NUM_BATCHED_TOKENS if serving else DEFAULT_MAX_NUM_BATCHED_TOKENS
    group.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None,
                       help=f"tokens computed per step, all requests together, e.g. 2048 or 8k "
                            f"as --max-model-len reads it (default: {step}; "
                            f"without chunked prefill, the larger of {DEFAULT_MAX_NUM_BATCHED_TOKENS} and the "
                            f"context length)")
    parser.set_defaults(chunked_step_tokens=step)
    group.add_argument("--max-model-len", type=human_readable_int, default=None,
                       help="context length, e.g. 8192, 32k (32,000) or 32K (32,768) "
                            "(default: the model's)")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                       default=_DEFAULTS.enable_prefix_caching)
    group.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                       default=_DEFAULTS.enable_chunked_prefill,
                       help="split long prompts across steps, beside the running decodes; off, a "
                            "prompt is computed in one step, whose budget then defaults to the "
                            "context length (default: on)")
    group.add_argument("--long-prefill-token-threshold", type=human_readable_int,
                       default=_DEFAULTS.long_prefill_token_threshold,
                       help="a prompt longer than this takes at most this many tokens a step, "
                            "leaving the rest of the budget to shorter prompts queued with it "
                            "(default: 0, no cap)")
    group.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES,
                       default=_DEFAULTS.scheduling_policy,
                       help="fcfs: first come first served; priority: by each request's "
                            "'priority' (lower first), then arrival, and preemption takes the "
                            "lowest priority (default: %(default)s)")
    group.add_argument("--generation-config", default=_DEFAULTS.generation_config,
                       help="auto: the model's generation_config.json sets the defaults of "
                            "requests that leave temperature, top_p, top_k, min_p, "
                            "repetition_penalty or max_tokens out (as vLLM does); vllm: it does "
                            "not; or a folder with the generation_config.json to use. Its "
                            "eos_token_id list ends generations in every case "
                            "(default: %(default)s)")
    group.add_argument("--num-threads", type=int, default=None, help="CPU threads for torch")
    group.add_argument("--speculative-config", type=_speculative_config, default=None,
                       help="speculative decoding as JSON, e.g. '{\"method\": \"ngram\", "
                            "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}': drafts "
                            "from n-grams of the prompt and output, verified in one step")
    group.add_argument("--seed", type=int, default=_DEFAULTS.seed,
                       help="the engine's seed, which samples requests that bring no seed of "
                            "their own (default: %(default)s)")


def human_readable_int(text: str) -> int:
    """'32768', '32k' (32,000), '25.6k' (25,600) or '32K' (32,768) -> an int."""
    match = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kmgtKMGT]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not an integer (examples: 8192, 32k, 32K): {text!r}")
    number, suffix = match.groups()
    if suffix in DECIMAL_SUFFIXES:
        return int(float(number) * DECIMAL_SUFFIXES[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(f"not a whole number (decimals only with the decimal "
                                         f"suffixes k, m, g, t): {text!r}")
    return int(number) * BINARY_SUFFIXES.get(suffix, 1)


def _speculative_config(text: str) -> SpeculativeConfig:
    try:
        return SpeculativeConfig.from_json(text)
    except InferlabError as e:  # argparse's usage error (exit 2), not a traceback
        raise argparse.ArgumentTypeError(str(e)) from None


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine's config; bad flags, and a model that is not there, fail here, before torch
    and the model load."""
    resolve_model_path(args.model)
    return EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device,
        kv_cache_memory_bytes=(None if args.kv_cache_memory is None
                               else parse_bytes(args.kv_cache_memory, "--kv-cache-memory")),
        gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=_step_tokens(args),
        max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        scheduling_policy=args.scheduling_policy, generation_config=args.generation_config,
        num_threads=args.num_threads, seed=args.seed, speculative_config=args.speculative_config,
    )


def _step_tokens(args: argparse.Namespace) -> int | None:
    """The flag, else this command's default with chunked prefill (None: the engine's without)."""
    if args.max_num_batched_tokens is not None or not args.enable_chunked_prefill:
        return args.max_num_batched_tokens
    return args.chunked_step_tokens
