"""Load a compressed-tensors checkpoint into a model: quantized layers built from the codes.

`apply_compressed_tensors` swaps every linear layer the config quantizes for a QuantLinear built
straight from the checkpoint's packed codes and scales (never a dequantized fp weight), and
returns the tensors it did not use (norms, embeddings, unquantized linears) for the ordinary
loader. A fused layer (qkv_proj, gate_up_proj) takes its shards' codes concatenated along the
output dimension, which is exact because every scale belongs to one output row.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from torch import nn

from inferlab.errors import ModelLoadError
from inferlab.models.fused_layers import FUSED_SHARDS
from inferlab.quant.checkpoint import (
    QUANT_SUFFIXES,
    CheckpointError,
    cat_rows,
    read_quantized_weight,
)
from inferlab.quant.ct_config import ConfigGroup, ParsedConfig, parse_quantization_config
from inferlab.quant.linear import build_quant_linear


def checkpoint_names(module_name: str) -> list[str]:
    """Our module name -> the HF names its weight is stored under (shards for fused layers)."""
    parent, _, leaf = module_name.rpartition(".")
    if leaf in FUSED_SHARDS:
        return [f"{parent}.{shard}" if parent else shard for shard in FUSED_SHARDS[leaf]]
    return [module_name]


def apply_compressed_tensors(model: nn.Module, quant_config: Mapping,
                             tensors: Mapping[str, torch.Tensor], checkpoint: str,
                             dtype: torch.dtype | None = None,
                             device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Swap the quantized linears of `model` for QuantLinears built from `tensors`, those of the
    `checkpoint` directory that the errors name; return the rest.

    `model` may live on the meta device; quantized layers are built on `device` and compute in
    `dtype` (default: the model's parameter dtype).
    """
    config_file = os.path.join(checkpoint, "config.json")
    parsed = parse_quantization_config(quant_config, config_file)
    try:
        return _swap_quantized(model, parsed, tensors, dtype or next(model.parameters()).dtype,
                               device)
    except CheckpointError as e:
        raise ModelLoadError(f"{config_file if e.in_config else checkpoint}: {e}") from None


def _swap_quantized(model: nn.Module, parsed: ParsedConfig, tensors: Mapping[str, torch.Tensor],
                    dtype: torch.dtype, device: torch.device | str) -> dict[str, torch.Tensor]:
    rest = dict(tensors)
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, module in linears:
        shards = checkpoint_names(name)
        if not any(_has_any(rest, s) for s in shards):
            continue  # not in the checkpoint (a tied lm_head): the loader decides
        group = _shard_group(parsed, shards, rest, name)
        if group is None:
            continue
        parts = [read_quantized_weight(rest, s, group.scheme, group.format, group.g_idx)
                 for s in shards]
        qw = parts[0] if len(parts) == 1 else cat_rows(parts, name)
        if qw.shape != (module.out_features, module.in_features):
            raise CheckpointError(f"{name} is [{qw.shape[0]}, {qw.shape[1]}], the model "
                                  f"expects [{module.out_features}, {module.in_features}]")
        bias = _take_bias(rest, shards, name)
        layer = build_quant_linear(qw, group.scheme.activations, bias, dtype, device)
        _set_submodule(model, name, layer)
        for s in shards:
            for key in [k for k in rest if k.startswith(f"{s}.")]:
                del rest[key]
    leftover = sorted(k for k in rest if k.rsplit(".", 1)[-1] in QUANT_SUFFIXES)
    if leftover:
        raise CheckpointError(f"{leftover[0]} belongs to no quantized linear layer of "
                              "this model (the config and the tensors disagree)")
    return rest


def _has_any(tensors: Mapping[str, torch.Tensor], prefix: str) -> bool:
    return any(f"{prefix}.{s}" in tensors for s in ("weight", *QUANT_SUFFIXES))


def _is_quantized(tensors: Mapping[str, torch.Tensor], prefix: str) -> bool:
    return f"{prefix}.weight_scale" in tensors or f"{prefix}.weight_packed" in tensors


def _shard_group(parsed: ParsedConfig, shards: list[str], tensors: Mapping[str, torch.Tensor],
                 name: str) -> ConfigGroup | None:
    """The one group all shards of `name` share; config and tensors must agree on each shard."""
    groups = []
    for shard in shards:
        group = parsed.group_for(shard)
        if group is None and _is_quantized(tensors, shard):
            raise CheckpointError(f"{shard} has quantized tensors but the config leaves "
                                  "it unquantized (ignored or untargeted)")
        if group is not None and not _is_quantized(tensors, shard):
            raise CheckpointError(f"the config quantizes {shard} ({group.name}) but "
                                  f"{shard}.weight_scale is missing")
        groups.append(group)
    if len(set(groups)) > 1:
        raise CheckpointError(f"the shards of {name} ({', '.join(shards)}) are quantized "
                              "differently, so they cannot run as one fused layer")
    return groups[0]


def _take_bias(tensors: dict[str, torch.Tensor], shards: list[str], name: str) -> torch.Tensor | None:
    biases = [tensors.get(f"{s}.bias") for s in shards]
    if all(b is None for b in biases):
        return None
    if any(b is None for b in biases):
        raise CheckpointError(f"only some shards of {name} have a bias")
    return torch.cat(biases)


def _set_submodule(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, layer)
