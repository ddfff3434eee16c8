"""Apply a recipe to one decoder layer of our Llama-family model, given its calibration statistics.

Order inside a layer: fold smoothing/AWQ scales (float function unchanged), then compress each
linear (RTN, AWQ clip + RTN, GPTQ, SparseGPT, magnitude), then swap each quantized linear for
the QuantLinear that inference will use, so the layer's outputs that feed the next layer's
calibration are the quantized model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from inferlab.kernels.fused import silu_and_mul
from inferlab.kernels.scaled_mm import FP8_MAX, INT8_MAX
from inferlab.quant.algorithms.awq import Block, search_clip, search_scales
from inferlab.quant.algorithms.fold import fold_scales
from inferlab.quant.algorithms.obs import obs_compress
from inferlab.quant.algorithms.smoothquant import smoothing_scales
from inferlab.quant.algorithms.sparsity import magnitude_2of4_mask
from inferlab.quant.algorithms.stats import InputStats
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.qparams import (
    QuantizedWeight,
    compute_qparams,
    quantize,
    quantize_rtn,
    stored_scale,
)
from inferlab.quant.recipe import Recipe
from inferlab.quant.scheme import FLOAT, ActivationArgs

LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


@dataclass
class LayerContext:
    layer: nn.Module  # LlamaDecoderLayer
    prefix: str  # "model.layers.3"
    targets: list[str]  # local names of the linears to compress
    stats: dict[str, InputStats]
    recipe: Recipe
    q_size: int
    kv_size: int
    scale_dtype: torch.dtype

    def weight(self, name: str) -> torch.Tensor:
        return self.layer.get_submodule(name).weight.data


@dataclass
class Producer:
    """What produces a linear's input: an RMSNorm weight or some rows of a linear (+ bias)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


def producers(ctx: LayerContext) -> dict[str, Producer]:
    """Consumer linear -> its producer, for the pairs where folding is exact."""
    layer = ctx.layer
    inter = layer.mlp.down_proj.in_features
    pairs = {
        "self_attn.qkv_proj": Producer(layer.input_layernorm.weight.data),
        "mlp.gate_up_proj": Producer(layer.post_attention_layernorm.weight.data),
        "mlp.down_proj": Producer(layer.mlp.gate_up_proj.weight.data[inter:]),  # up rows
    }
    if ctx.q_size == ctx.kv_size:  # v feeds o channel for channel only without grouped KV heads
        qkv = layer.self_attn.qkv_proj
        start = ctx.q_size + ctx.kv_size
        bias = qkv.bias.data[start:] if qkv.bias is not None else None
        pairs["self_attn.o_proj"] = Producer(qkv.weight.data[start:], bias)
    return {name: p for name, p in pairs.items() if name in ctx.targets}


def smooth(ctx: LayerContext) -> None:
    """SmoothQuant: fold s = max|x|^a / max|w|^(1-a) into every producer/consumer pair."""
    for name, producer in producers(ctx).items():
        weight = ctx.weight(name)
        s = smoothing_scales(ctx.stats[name].abs_max, [weight], ctx.recipe.smoothquant_alpha)
        fold_scales(s, producer.weight, [weight], producer.bias)
        ctx.stats[name].scale_inputs(s)  # GPTQ then sees the smoothed inputs' Hessian


def awq_scale(ctx: LayerContext) -> None:
    """AWQ: search and fold the activation-aware scale of every producer/consumer pair."""
    args = ctx.recipe.scheme.weights
    for name, producer in producers(ctx).items():
        x = ctx.stats[name].samples()  # [T, K]
        weight = ctx.weight(name)
        s, _ = search_scales(x, [weight], args, _awq_block(ctx, name, x), ctx.recipe.awq)
        fold_scales(s, producer.weight, [weight], producer.bias)
        ctx.stats[name].scale_inputs(s)


def _awq_block(ctx: LayerContext, name: str, x: torch.Tensor) -> Block:
    """The output AWQ compares: the whole MLP for gate/up (its nonlinearity included), else the linear."""
    if name != "mlp.gate_up_proj":
        return lambda ws: x @ ws[0].t()
    down = ctx.weight("mlp.down_proj").float()
    return lambda ws: silu_and_mul(x @ ws[0].t()) @ down.t()


def compress_linear(ctx: LayerContext, name: str) -> tuple[torch.Tensor, QuantizedWeight | None]:
    """One linear's new dense weight (pruned and/or fake-quantized) and its codes, by method."""
    recipe, w = ctx.recipe, ctx.weight(name).float()
    args = recipe.scheme.weights if recipe.scheme is not None else None
    method = recipe.method
    if recipe.needs_hessian:  # SmoothQuant quantizes with GPTQ
        new_w, qw, _ = obs_compress(w, ctx.stats[name].hessian(), args, recipe.obs, ctx.scale_dtype)
        return new_w, qw
    if method == "magnitude":
        w = w * magnitude_2of4_mask(w)
    if args is None:
        return w, None
    if method == "awq" and recipe.awq.clip:
        rows = None
        if name == "self_attn.qkv_proj":  # AWQ clips v only
            rows = torch.arange(w.shape[0]) >= ctx.q_size + ctx.kv_size
        clip = search_clip(ctx.stats[name].samples(), w, args, recipe.awq, rows)
        scale, zero = compute_qparams(w, args, ctx.scale_dtype, clip=clip)
        qw = QuantizedWeight(quantize(w, scale, zero, args), scale, zero, args)
    else:
        qw = quantize_rtn(w, args, ctx.scale_dtype, where=f"{ctx.prefix}.{name}")
    return qw.dequantize(), qw


def static_input_scale(stats: InputStats, activations: ActivationArgs,
                       dtype: torch.dtype) -> torch.Tensor:
    """[1]: the largest |x| the calibration fed this linear maps to the top code (min-max, as
    llm-compressor's static observers; after SmoothQuant the statistics are the smoothed x's)."""
    qmax = FP8_MAX if activations.kind == FLOAT else INT8_MAX
    return stored_scale(stats.abs_max.max().float().clamp(min=1e-12) / qmax, dtype).reshape(1)


def process_layer(ctx: LayerContext) -> dict[str, QuantizedWeight]:
    """Compress the targeted linears of one layer in place; returns their codes by local name."""
    if ctx.recipe.method == "smoothquant":
        smooth(ctx)
    elif ctx.recipe.method == "awq":
        awq_scale(ctx)
    results: dict[str, QuantizedWeight] = {}
    activations = ctx.recipe.scheme.activations if ctx.recipe.scheme is not None else None
    for name in ctx.targets:
        new_w, qw = compress_linear(ctx, name)
        module = ctx.layer.get_submodule(name)
        if qw is None:
            module.weight.data.copy_(new_w)
            continue
        if activations is not None and activations.static:
            qw.input_scale = static_input_scale(ctx.stats[name], activations, ctx.scale_dtype)
        results[name] = qw
        bias = module.bias.data.float() if module.bias is not None else None
        parent, _, leaf = name.rpartition(".")
        setattr(ctx.layer.get_submodule(parent), leaf,
                build_quant_linear(qw, activations, bias, torch.float32))
    return results
