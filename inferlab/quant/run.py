"""The quantize command's work: load, check, calibrate, compress, write."""

from __future__ import annotations

import os
from typing import Any

import torch

from inferlab.errors import InferlabError
from inferlab.models.config import ModelConfig
from inferlab.quant.checkpoint import tensors_for
from inferlab.quant.ct_config import matches
from inferlab.quant.export import TORCH_DTYPES, export_checkpoint, shard_sizes
from inferlab.quant.layer import LINEARS
from inferlab.quant.load import checkpoint_names
from inferlab.quant.qparams import num_groups, rows_per_scale
from inferlab.quant.recipe import Recipe
from inferlab.quant.sequential import compress_model


def check_shapes(net: torch.nn.Module, recipe: Recipe) -> None:
    """Group size and 2:4 constraints on every targeted layer, before any calibration work.
    Errors name the checkpoint's layers (q_proj, not our fused qkv_proj): --ignore takes those."""
    for i, layer in enumerate(net.model.layers):
        for name in LINEARS:
            full = f"model.layers.{i}.{name}"
            if recipe.ignores(full):
                continue
            module = layer.get_submodule(name)
            rows = shard_sizes(full, net.config, module.out_features)
            for shard, n in zip(checkpoint_names(full), rows, strict=True):
                _check_shape(shard, n, module.in_features, recipe)


def _check_shape(name: str, n: int, k: int, recipe: Recipe) -> None:
    """One checkpoint layer of `n` outputs and `k` inputs."""
    if recipe.scheme is not None:
        num_groups(k, recipe.scheme.weights, name)
        rows_per_scale(recipe.scheme.weights, n, name)
    if recipe.sparsity is not None and k % 4:
        raise InferlabError(f"{name}: 2:4 sparsity needs inputs in multiples of 4, got {k}")


def check_ignore(net: torch.nn.Module, recipe: Recipe) -> None:
    """Each --ignore entry names some layer (a typo would quantize what it meant to keep, the
    lm_head among them once the default is replaced), and some layer is left to compress."""
    names = [shard for i in range(len(net.model.layers)) for name in LINEARS
             for shard in checkpoint_names(f"model.layers.{i}.{name}")]
    for pattern in recipe.ignore:
        if not any(matches(name, pattern) for name in [*names, "lm_head"]):
            raise InferlabError(f"--ignore {pattern!r} matches no layer (names look like "
                                f"{names[0]} or lm_head; patterns like re:.*q_proj)")
    if all(recipe.ignores(f"model.layers.{i}.{name}")
           for i in range(len(net.model.layers)) for name in LINEARS):
        raise InferlabError("--ignore leaves no decoder layer to compress")


def dense_dtype_for(config: ModelConfig, requested: str) -> torch.dtype:
    """auto: the source checkpoint's dtype (a GGUF, dequantized here, is written as float32)."""
    if requested != "auto":
        return TORCH_DTYPES[requested]
    return TORCH_DTYPES.get(config.extra.get("torch_dtype") or "float32", torch.float32)


def linear_bytes(net: torch.nn.Module, qweights: dict, fmt: str | None,
                 dense_dtype: torch.dtype) -> dict[str, int]:
    """Stored bytes of the decoder's linear weights, compressed vs the same weights in bf16."""
    stored = bf16 = 0
    for i, layer in enumerate(net.model.layers):
        for name in LINEARS:
            full = f"model.layers.{i}.{name}"
            module = layer.get_submodule(name)
            n, k = module.out_features, module.in_features
            bf16 += 2 * n * k
            if full in qweights:
                stored += sum(t.numel() * t.element_size()
                              for t in tensors_for(qweights[full], fmt).values())
            else:
                stored += n * k * torch.finfo(dense_dtype).bits // 8
    return {"linear_weight_bytes": stored, "linear_weight_bytes_bf16": bf16}


def quantize_to_directory(model: str | None, recipe: Recipe, out: str, calib: str,
                          num_samples: int, seq_len: int, batch_size: int, seed: int,
                          dense_dtype: str, progress: bool = True) -> dict[str, Any]:
    from inferlab.models.loader import load_model

    loaded = load_model(model, torch.float32)
    if loaded.config.extra.get("quantization_config"):
        raise InferlabError(f"{loaded.path}: already quantized (quantize the original model)")
    net = loaded.model
    check_shapes(net, recipe)
    check_ignore(net, recipe)
    dtype = dense_dtype_for(loaded.config, dense_dtype)
    tokens = None
    if recipe.needs_calibration:
        from inferlab.quant.calibration import load_calibration

        if seq_len > loaded.config.max_position_embeddings:  # its activations would be wrong
            raise InferlabError(f"--seq-len {seq_len} is longer than {loaded.name} can take: "
                                f"{loaded.config.max_position_embeddings} positions")
        tokens = load_calibration(calib, loaded.tokenizer, num_samples, seq_len, seed)
    qweights = compress_model(net, tokens, recipe, batch_size, dtype, progress)
    # absolute, as eval records its models: the record is read from other folders
    info = {"model": loaded.name, "source": os.path.abspath(loaded.path),
            "scheme": recipe.scheme.name if recipe.scheme else None, "method": recipe.method,
            "sparsity": recipe.sparsity, "ignore": list(recipe.ignore),
            "group_size": recipe.scheme.weights.group_size if recipe.scheme else None,
            "calibration": {"file": os.path.abspath(calib), "num_samples": num_samples, "seq_len": seq_len,
                            "batch_size": batch_size, "seed": seed} if tokens is not None else None,
            "method_settings": recipe.settings(seq_len),
            **linear_bytes(net, qweights, recipe.scheme.format if recipe.scheme else None, dtype)}
    export_checkpoint(out, net, qweights, recipe, loaded.path, loaded.tokenizer, dtype, info)
    return {"out": out, **info}
