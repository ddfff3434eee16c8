"""`inferlab info [MODEL]`: what a model is and what it costs in memory."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from inferlab.config import DTYPE_ALIASES, canonical_dtype
from inferlab.models.config import ModelConfig
from inferlab.models.gguf_reader import GGUFFile, is_gguf_file
from inferlab.planner.gguf_held import CODE_BITS, held_format
from inferlab.planner.memory import (
    WeightFormat,
    kv_cache_bytes_per_token,
    linear_layers,
    weight_bytes,
)
from inferlab.planner.model_shapes import scheme_weight_format
from inferlab.quant.ct_config import ParsedConfig, parse_quantization_config

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="architecture, parameters, weight and KV-cache bytes")
    parser.add_argument("model", nargs="?", default=None,
                        help="HF model directory or .gguf file (default: the embedded model)")
    parser.add_argument("--dtype", type=lambda name: DTYPE_ALIASES.get(name, name),
                        choices=("auto", *_DTYPE_BYTES), default="bfloat16",
                        help="dtype the byte counts are given for (default: bfloat16; auto: the "
                             "one serve picks on this machine; half and float as vLLM names "
                             "float16 and float32)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run_info)


def model_info(model: str | None, dtype: str) -> dict:
    from inferlab.models.generation_config import GenerationConfig, read_generation_config
    from inferlab.models.gguf import open_gguf
    from inferlab.models.loader import check_gguf_weights, read_model_config
    from inferlab.models.model_path import model_display_name, resolve_model_path
    from inferlab.models.tokenizer import load_gguf_tokenizer, load_hf_tokenizer

    path = resolve_model_path(model)
    cfg = read_model_config(path)
    generation = GenerationConfig()
    config = cfg.extra.get("quantization_config")
    parsed = _parsed_quantization(config, path)
    groups = parsed.groups if parsed else ()
    quantization = _quantization(config, parsed)
    held = None  # a GGUF's weights as the engine holds them in fp32 on this CPU, if as codes
    if is_gguf_file(path):
        # checked as loading checks them, in its order (weights, then tokenizer): `info` once
        # gave every figure for a file whose tensors or tokenizer `generate` refuses
        gguf_file = open_gguf(path)
        check_gguf_weights(path, gguf_file, cfg)
        template = load_gguf_tokenizer(gguf_file, path).chat_template
        held = held_format(path, "fp32") if dtype == "float32" else None
        quantization = [_gguf_types(gguf_file, held)]
    else:
        template = load_hf_tokenizer(path).chat_template
        generation = read_generation_config(path)
    nbytes = _DTYPE_BYTES[dtype]
    params = cfg.num_parameters()
    return {
        "name": model_display_name(model), "path": path, "architecture": cfg.architecture,
        "parameters": params, "dtype": dtype,
        "weight_bytes": weight_bytes(cfg, held).total_bytes if held else _weight_bytes(cfg, dtype, parsed),
        "linears_as_stored": bool(groups),
        "layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "attention_heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
        "kv_bytes_per_token": kv_cache_bytes_per_token(cfg.num_layers, cfg.num_kv_heads,
                                                       cfg.head_dim, nbytes),
        "context_length": cfg.max_positions, "sliding_window": cfg.sliding_window,
        "served_context_length": cfg.max_context,
        "tied_embeddings": cfg.tie_word_embeddings, "chat_template": bool(template),
        "end_token_ids": list(generation.end_token_ids(cfg.eos_token_ids)),
        "generation_defaults": generation.sampling_defaults,
        "quantization": quantization,
        "checkpoint_bytes": _checkpoint_bytes(path),
    }


def _weight_bytes(cfg: ModelConfig, dtype: str, parsed: ParsedConfig | None) -> int:
    """What the weights take loaded in `dtype`: a compressed-tensors checkpoint's decoder linears
    in their stored formats (codes and scales as the planner counts them), the rest in dtype.
    Each group is counted in its own format over the layers it takes (ParsedConfig.group_for),
    as the loader (and vLLM) take a non-uniform config scheme by scheme. Loaded, zero points are
    held at the scales' size, not packed as the file has them."""
    stored_params = stored_bytes = 0
    layers = [name for name, _, _ in linear_layers(cfg)]
    for group in parsed.groups if parsed else ():
        taken = tuple(name for name in layers if parsed.group_for(name) is group)
        fmt = dataclasses.replace(scheme_weight_format(group.scheme), dense_dtype=dtype,
                                  targets=taken, ignore=())
        counted = weight_bytes(cfg, fmt)
        stored_params += counted.quantized_params
        stored_bytes += counted.packed_bytes + counted.scale_bytes * (1 if fmt.symmetric else 2)
    return stored_bytes + (cfg.num_parameters() - stored_params) * _DTYPE_BYTES[dtype]


def _parsed_quantization(config: dict | None, path: str) -> ParsedConfig | None:
    """The compressed-tensors config, checked as loading checks it, so a config the loader
    refuses fails here with the same error, naming the same file."""
    if not config:
        return None
    return parse_quantization_config(config, os.path.join(path, "config.json"))


def _quantization(config: dict | None, parsed: ParsedConfig | None) -> list[str]:
    """Each group in a line: what it quantizes and how; and the sparsity of a pruned model."""
    if parsed is None:
        return []
    ignore = f"; ignores {', '.join(parsed.ignore)}" if parsed.ignore else ""
    lines = [f"{g.scheme.describe()} ({', '.join(g.targets)}{ignore})" for g in parsed.groups]
    sparsity = config.get("sparsity_config") or {}
    if sparsity.get("sparsity_structure"):  # a pruned checkpoint, quantized or not
        share = sparsity.get("global_sparsity")
        zeros = f", {share:.0%} of the weights zero" if isinstance(share, float) else ""
        lines.append(f"{sparsity['sparsity_structure']} sparsity, stored dense{zeros}")
    return lines


def _gguf_types(gguf_file: GGUFFile, held: WeightFormat | None) -> str:
    """The GGUF's tensor types by count ('Q4_1 x 211, F32 x 61'): the engine dequantizes them
    to the serving dtype at load, and in fp32 on an AVX2 CPU (`held`) keeps the linears whose
    blocks it can as their codes (inferlab/planner/gguf_held.py)."""
    counts: dict[str, int] = {}
    for tensor in gguf_file.tensors:
        counts[tensor.type_name] = counts.get(tensor.type_name, 0) + 1
    kinds = ", ".join(f"{name} x {n}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    coded = sorted({kind for _, kind in held.gguf_types if kind in CODE_BITS}) if held else []
    how = f"linears held as their {', '.join(coded)} codes" if coded else "dequantized at load"
    return f"GGUF tensors {kinds} ({how})"


def _checkpoint_bytes(path: str) -> int:
    """Bytes of the weight files the loader reads, as stored (compressed weights at their
    compressed size); a directory without them is refused as loading refuses it (`info` once
    reported 0 bytes for it and every figure as if it would load)."""
    from inferlab.models.loader import safetensors_files

    files = safetensors_files(path) if os.path.isdir(path) else [path]
    return sum(os.path.getsize(f) for f in files)


def _served_dtype(dtype: str) -> str:
    """`auto` as serve resolves it here (bf16 on a GPU or a CPU with fast bf16, else fp32)."""
    if dtype != "auto":
        return dtype
    from inferlab.engine.platform import resolve_device, resolve_dtype

    return canonical_dtype(resolve_dtype("auto", resolve_device("auto")))


def run_info(args: argparse.Namespace) -> int:
    args.dtype = _served_dtype(args.dtype)
    info = model_info(args.model, args.dtype)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    nbytes = _DTYPE_BYTES[args.dtype]
    stored = ", linears as stored" if info["linears_as_stored"] else ""
    rows = [
        ("model", f"{info['name']} ({info['path']})"),
        ("architecture", info["architecture"]),
        ("parameters", f"{info['parameters']:,}"),
        (f"weight bytes ({args.dtype}{stored})", f"{info['weight_bytes']:,} ({info['weight_bytes'] / 2**20:.1f} MiB)"),
        ("checkpoint bytes", f"{info['checkpoint_bytes']:,} ({info['checkpoint_bytes'] / 2**20:.1f} MiB)"),
        *(("quantization", line) for line in info["quantization"] or ["none"]),
        ("layers", info["layers"]),
        ("hidden size", info["hidden_size"]),
        ("attention heads", f"{info['attention_heads']} ({info['kv_heads']} KV heads)"),
        ("head dim", info["head_dim"]),
        ("vocab size", f"{info['vocab_size']:,}"),
        (f"KV cache per token ({args.dtype})",
         f"2 × {info['layers']} layers × {info['kv_heads']} KV heads × {info['head_dim']} head dim × "
         f"{nbytes} bytes = {info['kv_bytes_per_token']:,} bytes"),
        ("context length", f"{info['context_length']:,}"
                           + (f" (served: {info['served_context_length']:,}, the sliding window)"
                              if info["served_context_length"] < info["context_length"] else "")),
        ("tied embeddings", "yes" if info["tied_embeddings"] else "no"),
        ("chat template", "present" if info["chat_template"] else "absent"),
        ("end-of-generation ids", ", ".join(map(str, info["end_token_ids"])) or "none"),
        ("request defaults", ", ".join(f"{k}={v}" for k, v in info["generation_defaults"].items())
         or "none (no generation_config.json sets any)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
