"""Shared by the benchmark scripts: prompts cut from WikiText-2, this machine's roofline, their
argument parser and the argparse types that refuse bad arguments when parsed (a usage line, one
error line, exit 2) rather than as a traceback after a model load or a whole run, and their exit
on SIGTERM."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from inferlab.config import MAX_THREADS
from inferlab.errors import InferlabError
from inferlab.shared_data import WIKITEXT_TEST
from inferlab.user_files import check_writable

WIKITEXT = WIKITEXT_TEST


def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser of a script whose --help shows its whole docstring as written: what it
    measures, why, and how to run it (a first line alone stops mid-sentence)."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def exit_on_sigterm() -> None:
    """SIGTERM (`timeout`, `kill`) exits as Ctrl-C does, through the finally blocks and context
    managers: the servers a script started are stopped and its temporary folders removed."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def bounded_int(least: int, most: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from `least` (to `most`, when given)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < least or (most is not None and value > most):
            span = f">= {least}" if most is None else f"from {least} to {most}"
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {value}")
        return value
    return parse


positive_int = bounded_int(1)  # counts: rounds, steps, windows, rows, requests
thread_count = bounded_int(1, MAX_THREADS)  # torch.set_num_threads(100000) is a segfault


def bounded_float(above: float, most: float = math.inf) -> Callable[[str], float]:
    """An argparse type: a finite number over `above` and at most `most` (NaN and inf refused)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and above < value <= most):
            span = f"> {above:.15g}" + (f" and at most {most:.15g}" if most < math.inf else "")
            raise argparse.ArgumentTypeError(f"must be a finite number {span}, got {text}")
        return value
    return parse


def output_file(text: str) -> str:
    """An argparse type: a file the results will be written to (--json), checked before the
    run so that a missing or read-only folder does not lose a finished run's figures."""
    try:
        check_writable(text)
    except InferlabError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def existing_file(text: str) -> str:
    """An argparse type: a file that must be there (a GGUF file, a binary) when the run needs it,
    maybe minutes in."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return text


def model_path(text: str) -> str:
    """An argparse type: a model directory or GGUF file whose config reads (no weights loaded),
    refused before any work rather than after the minutes before its load."""
    from inferlab.models.loader import read_model_config
    from inferlab.models.model_path import resolve_model_path

    try:
        read_model_config(resolve_model_path(text))
    except InferlabError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def scheme_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names of quantization schemes (inferlab.quant.scheme's
    SCHEME_NAMES), each one of `allowed`."""
    def parse(text: str) -> list[str]:
        names = [name.strip().upper() for name in text.split(",")]
        if unknown := [name for name in names if name not in allowed]:
            raise argparse.ArgumentTypeError(f"{unknown[0]!r} is not one of {', '.join(allowed)}")
        return names
    return parse


def wikitext_prompts(tokenizer, count: int, tokens: int, offset: int = 0) -> list[list[int]]:
    """`count` distinct prompts of exactly `tokens` token ids, consecutive slices of the test text."""
    if not WIKITEXT.is_file():
        sys.exit(f"{WIKITEXT} is absent: the benchmarks read the shared WikiText-2 test text")
    ids = tokenizer.encode(WIKITEXT.read_text(encoding="utf-8")[: 12 * (count * tokens + offset) + 10_000],
                           add_special_tokens=False)
    ids = ids[offset:]
    if len(ids) < count * tokens:
        sys.exit(f"not enough text for {count} prompts of {tokens} tokens")
    return [ids[i * tokens:(i + 1) * tokens] for i in range(count)]


def machine_roofline() -> dict:
    """Measured memory bandwidth (bytes/s) and matmul peaks (FLOP/s) of this machine, now."""
    from inferlab.planner.measure import measure_cpu

    return measure_cpu(repeats=3)


def announced_roofline(dtype_name: str, rounds: int) -> tuple[float, float]:
    """(bandwidth bytes/s, matmul peak FLOP/s for dtype_name), measured now and printed."""
    roof = machine_roofline()
    bandwidth = roof["memory_bandwidth_bytes_per_s"]
    peak = roof["peak_flops"]["bf16" if dtype_name == "bfloat16" else "fp32"]
    print(f"machine: {roof['cpu']}, {roof['threads']} threads, {bandwidth / 1e9:.1f} GB/s, "
          f"{peak / 1e12:.2f} TFLOP/s ({dtype_name} matmul); medians of {rounds} interleaved rounds")
    return bandwidth, peak


def bytes_read_per_decode_step(model) -> int:
    """Bytes of the weights one decode step reads: every linear layer and norm (the embedding
    and RoPE tables are only indexed, a few rows per step)."""
    total = 0
    for name, module in model.named_modules():
        if name.endswith(("embed_tokens", "rotary")):
            continue
        for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            total += tensor.numel() * tensor.element_size() if tensor is not None else 0
    return total


def prefill_flops_per_token(cfg, prompt_tokens: int) -> float:
    """Matmul FLOPs per token of a prompt's prefill: 2 per weight of the decoder layers, and the
    lm_head's 2 per weight once per prompt (logits only for its last token). The embedding
    lookup is none; attention's products are left out."""
    lm_head = cfg.vocab_size * cfg.hidden_size
    lookup = 0 if cfg.tie_word_embeddings else lm_head
    return 2 * (cfg.num_parameters() - lookup - lm_head) + 2 * lm_head / prompt_tokens


def decode_step_floor_s(cfg, weight_bytes: int, batch: int, context: int, kv_elem_bytes: int,
                        bandwidth: float, peak_flops: float) -> tuple[float, float]:
    """A decode step's roofline, (memory s, compute s), for `batch` sequences of `context`
    tokens: the weights and every sequence's K and V read once at the bandwidth; the linears,
    the lm_head and attention's QK^T and PV at the matmul peak. The step takes at least the
    larger of the two."""
    kv_bytes = batch * context * 2 * cfg.num_layers * cfg.kv_size * kv_elem_bytes
    attention_flops = batch * context * 4 * cfg.q_size * cfg.num_layers
    matmul_flops = batch * prefill_flops_per_token(cfg, 1)  # every decode token gets its logits
    return (weight_bytes + kv_bytes) / bandwidth, (matmul_flops + attention_flops) / peak_flops


def output_rate_bound(cfg, weight_bytes: int, streams: int, prompt_tokens: int, output_tokens: int,
                      kv_elem_bytes: int, bandwidth: float, peak_flops: float) -> float:
    """Output tokens/s on the roofline for `streams` concurrent requests, each `prompt_tokens` in
    and `output_tokens` out: every request's prefill at the matmul peak (its linears, the lm_head
    once, causal attention), and `output_tokens` decode steps of `streams` sequences at
    decode_step_floor_s, taken at the mean context."""
    causal_pairs = prompt_tokens * (prompt_tokens + 1) / 2
    prefill_flops = (prompt_tokens * prefill_flops_per_token(cfg, prompt_tokens)
                     + causal_pairs * 4 * cfg.q_size * cfg.num_layers)
    step_s = max(decode_step_floor_s(cfg, weight_bytes, streams, prompt_tokens + output_tokens // 2,
                                     kv_elem_bytes, bandwidth, peak_flops))
    return streams * output_tokens / (streams * prefill_flops / peak_flops + output_tokens * step_s)


def rounds_text(values: Sequence[float], fmt: str) -> str:
    """Each round's figure, as the scripts print them: "1.93 / 2.06 / 1.95"."""
    return " / ".join(format(v, fmt) for v in values)


if __name__ == "__main__":
    raise SystemExit("the workloads that the benchmarks share, not a script: see BENCHMARKS.md")
