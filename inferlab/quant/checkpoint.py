"""compressed-tensors checkpoints: the tensors of one quantized linear, both ways, and the config.

Per linear layer `X` (local names as compressed-tensors writes them):
* pack-quantized (W4A16, W8A16): X.weight_packed int32 [N, ceil(K*b/32)], X.weight_scale [N, G],
  X.weight_shape int64 [2], and when asymmetric X.weight_zero_point int32 [ceil(N*b/32), G];
* int-quantized (W8A8) / float-quantized (FP8_DYNAMIC, FP8) / naive-quantized: X.weight int8 or
  float8_e4m3fn [N, K] and X.weight_scale [N, 1] (G columns when grouped, [1] per tensor);
* static activations (FP8): X.input_scale [1], one scale for every token.
Reading checks every shape and dtype against the config, so a checkpoint whose config
contradicts its tensors fails with one line naming the tensor. X.weight_g_idx (GPTQ group
act-order) loads only when it keeps the groups contiguous, which is all the kernels compute.
"""

from __future__ import annotations

from typing import Any

import torch

from inferlab.errors import InferlabError
from inferlab.quant.formats.int_pack import (
    pack_int32,
    pack_zero_points,
    unpack_int32,
    unpack_zero_points,
)
from inferlab.quant.qparams import QuantizedWeight, num_groups, rows_per_scale
from inferlab.quant.scheme import (
    BLOCK,
    FLOAT,
    GROUP,
    GROUPED,
    PACK_QUANTIZED,
    TENSOR,
    QuantScheme,
    WeightArgs,
)

QUANT_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
                  "input_scale", "input_zero_point", "weight_global_scale", "weight_g_idx")
COMPRESSED_TENSORS_VERSION = "0.20.1"  # the library release whose format this follows


class CheckpointError(InferlabError):
    """Tensors that contradict the config, or (`in_config`) a config that contradicts the
    weights' shapes. The message names neither file: the loader, which knows the checkpoint,
    puts its directory (or its config.json) in front, as it does for a dense checkpoint."""

    def __init__(self, message: str, in_config: bool = False) -> None:
        super().__init__(message)
        self.in_config = in_config


def tensors_for(qw: QuantizedWeight, fmt: str) -> dict[str, torch.Tensor]:
    """One layer's quantized weight -> its checkpoint tensors (local names)."""
    rows = rows_per_scale(qw.args, qw.shape[0], "a quantized weight")

    def stored(per_row: torch.Tensor) -> torch.Tensor:
        """Held once a row in memory, once a block (or tensor: shape [1]) in the file."""
        once = per_row[::rows].contiguous()
        return once.reshape(1) if qw.args.strategy == TENSOR else once

    out: dict[str, torch.Tensor] = {"weight_scale": stored(qw.scale)}
    if fmt == PACK_QUANTIZED:
        out["weight_packed"] = pack_int32(qw.codes, qw.args.num_bits)
        out["weight_shape"] = torch.tensor(qw.shape, dtype=torch.int64)
        if qw.zero_point is not None:
            out["weight_zero_point"] = pack_zero_points(qw.zero_point, qw.args.num_bits)
    else:
        out["weight"] = qw.codes.contiguous()
        if qw.zero_point is not None:
            out["weight_zero_point"] = stored(qw.zero_point)
    if qw.input_scale is not None:
        out["input_scale"] = qw.input_scale.reshape(1).clone()  # shards share it: one copy each
    return out


def quantization_config(scheme: QuantScheme | None, ignore: list[str],
                        sparsity: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json's `quantization_config` (the shape compressed-tensors' ModelCompressor writes)."""
    groups = {} if scheme is None else {"group_0": scheme.to_ct_group(["Linear"])}
    return {
        "config_groups": groups,
        "format": "dense" if scheme is None else scheme.format,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": sparsity or {},
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }


def _need(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise CheckpointError(f"the config quantizes {name.rsplit('.', 1)[0]} "
                              f"but {name} is missing")
    return tensors[name]


def _scale_matrix(scale: torch.Tensor, n: int, k: int, scheme: QuantScheme, name: str) -> torch.Tensor:
    """weight_scale in any of compressed-tensors' shapes -> [N, G] (a scale shared by rows
    repeated for each), checked against the config."""
    w = scheme.weights
    if not scale.is_floating_point():
        raise CheckpointError(f"{name} must be floating point, got {scale.dtype}")
    rows, groups = _scale_layout(w, n, k, name.removesuffix(".weight_scale"))
    if scale.numel() != n // rows * groups or (scale.dim() == 2 and scale.shape[0] != n // rows):
        detail = {GROUP: f" {w.group_size}", BLOCK: f" {w.block_rows}x{w.group_size}"}.get(w.strategy, "")
        raise CheckpointError(f"{name} has shape {tuple(scale.shape)}, the config "
                              f"({w.strategy}{detail}) implies [{n // rows}, {groups}]")
    return scale.reshape(n // rows, groups).repeat_interleave(rows, dim=0)


def _scale_layout(w: WeightArgs, n: int, k: int, layer: str) -> tuple[int, int]:
    """Rows per scale and groups per row of `layer`'s [n, k] weight. A block or group the config
    sets that does not divide it is the config's fault, and no flag of `inferlab quantize`
    fixes a checkpoint already written."""
    try:
        return rows_per_scale(w, n, layer), num_groups(k, w, layer, suggest=False)
    except InferlabError as e:
        raise CheckpointError(str(e), in_config=True) from None


def read_quantized_weight(tensors: dict[str, torch.Tensor], prefix: str, scheme: QuantScheme,
                          fmt: str, g_idx_required: bool = False) -> QuantizedWeight:
    """The tensors of layer `prefix` -> QuantizedWeight, validated against `scheme` and `fmt`
    (one of READABLE_FORMATS, as parse_quantization_config checks; `g_idx_required`: the config
    declares group act-order)."""
    w = scheme.weights
    if fmt == PACK_QUANTIZED:
        codes = _read_packed(tensors, prefix, w.num_bits)
    else:
        codes = _need(tensors, f"{prefix}.weight")
        want = torch.float8_e4m3fn if w.kind == FLOAT else torch.int8
        if codes.dtype != want or codes.dim() != 2:
            raise CheckpointError(f"{prefix}.weight is {codes.dim()}-d {codes.dtype}, "
                                  f"the config ({w.num_bits}-bit {w.kind}) implies 2-d {want}")
        if w.kind != FLOAT and codes.numel() and not w.qmin <= int(codes.min()) <= int(codes.max()) <= w.qmax:
            raise CheckpointError(f"{prefix}.weight holds values outside the "
                                  f"{w.num_bits}-bit range [{w.qmin}, {w.qmax}]")
    n, k = codes.shape
    _check_g_idx(tensors, prefix, w, k, g_idx_required)
    scale = _scale_matrix(_need(tensors, f"{prefix}.weight_scale"), n, k, scheme,
                          f"{prefix}.weight_scale")
    zero_point = None
    if not w.symmetric:
        zero_point = _read_zero_point(tensors, prefix, scheme, fmt, n, scale.shape[1])
    elif f"{prefix}.weight_zero_point" in tensors and tensors[f"{prefix}.weight_zero_point"].any():
        raise CheckpointError(f"{prefix}.weight_zero_point is non-zero but the config "
                              "says the weights are symmetric")
    input_scale = None
    if scheme.activations is not None and scheme.activations.static:
        input_scale = _read_input_scale(tensors, prefix)
    return QuantizedWeight(codes, scale, zero_point, w, input_scale)


def _read_input_scale(tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """A static activation scale: one positive finite value, as fp32 [1]."""
    name = f"{prefix}.input_scale"
    scale = _need(tensors, name)
    if not scale.is_floating_point() or scale.numel() != 1:
        raise CheckpointError(f"{name} is {scale.dtype} {tuple(scale.shape)}, a static "
                              "per-tensor scale is one floating-point value")
    value = scale.float().reshape(1)
    if not (torch.isfinite(value).all() and value.item() > 0):
        raise CheckpointError(f"{name} is {value.item()}, it must be positive and finite")
    zero = tensors.get(f"{prefix}.input_zero_point")
    if zero is not None and zero.any():
        raise CheckpointError(f"{prefix}.input_zero_point is non-zero: asymmetric "
                              "activations are not supported")
    return value


def _check_g_idx(tensors: dict[str, torch.Tensor], prefix: str, w: WeightArgs, k: int,
                 required: bool) -> None:
    """g_idx[i] is the group of input column i. Our kernels give column i the scale of group
    i // group_size, so any other assignment would silently compute the wrong product."""
    name = f"{prefix}.weight_g_idx"
    if name not in tensors:
        if required:
            raise CheckpointError(f"the config quantizes {prefix} with group act-order "
                                  f"but {name} is missing")
        return
    g_idx = tensors[name]
    if g_idx.is_floating_point() or g_idx.is_complex() or tuple(g_idx.shape) != (k,):
        raise CheckpointError(f"{name} is {g_idx.dtype} {tuple(g_idx.shape)}, expected "
                              f"one integer group index per input column [{k}]")
    group_size = w.group_size if w.strategy in GROUPED else k
    if not torch.equal(g_idx.to(torch.int64), torch.arange(k, device=g_idx.device) // group_size):
        raise CheckpointError(f"{name} assigns the inputs of {prefix} to groups out of "
                              "order (GPTQ group act-order, actorder 'group'), which is not "
                              "supported; quantize with actorder 'weight' or none")


def _read_packed(tensors: dict[str, torch.Tensor], prefix: str, num_bits: int) -> torch.Tensor:
    packed = _need(tensors, f"{prefix}.weight_packed")
    shape = _need(tensors, f"{prefix}.weight_shape")
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise CheckpointError(f"{prefix}.weight_packed must be 2-d int32, got "
                              f"{packed.dim()}-d {packed.dtype}")
    if shape.numel() != 2:
        raise CheckpointError(f"{prefix}.weight_shape must hold two sizes")
    n, k = (int(v) for v in shape.reshape(-1))
    words = -(-k * num_bits // 32)
    if tuple(packed.shape) != (n, words):
        raise CheckpointError(f"{prefix}.weight_packed has shape {tuple(packed.shape)}, "
                              f"a [{n}, {k}] weight of {num_bits}-bit values packs to [{n}, {words}]")
    try:
        return unpack_int32(packed, num_bits, k)
    except ValueError as e:
        raise CheckpointError(f"{prefix}.weight_packed: {e}") from None


def _read_zero_point(tensors: dict[str, torch.Tensor], prefix: str, scheme: QuantScheme, fmt: str,
                     n: int, groups: int) -> torch.Tensor:
    name = f"{prefix}.weight_zero_point"
    zp = _need(tensors, name)
    w = scheme.weights
    if fmt == PACK_QUANTIZED and w.strategy != TENSOR:
        rows = -(-n * w.num_bits // 32)
        if zp.dtype != torch.int32 or tuple(zp.shape) != (rows, groups):
            raise CheckpointError(f"{name} is {zp.dtype} {tuple(zp.shape)}, the config "
                                  f"implies int32 [{rows}, {groups}] (packed along the outputs)")
        return unpack_zero_points(zp, w.num_bits, n)
    if zp.numel() == 1:
        zp = zp.reshape(1, 1).expand(n, groups)
    if zp.numel() != n * groups:
        raise CheckpointError(f"{name} has shape {tuple(zp.shape)}, expected [{n}, {groups}]")
    zp = zp.reshape(n, groups)
    return (zp.round() if zp.is_floating_point() else zp).to(torch.int8).contiguous()


def cat_rows(parts: list[QuantizedWeight], where: str) -> QuantizedWeight:
    """Shards along the output dimension (q|k|v, gate|up) -> one weight; exact, since every scale
    and zero point belongs to one output row."""
    first = parts[0]
    for p in parts[1:]:
        if p.args != first.args or p.shape[1] != first.shape[1] or p.scale.shape[1] != first.scale.shape[1]:
            raise CheckpointError(f"the parts of {where} are quantized differently")
    zps = [p.zero_point for p in parts]
    zero_point = None if zps[0] is None else torch.cat(zps, dim=0)
    scale = torch.cat([p.scale.to(first.scale.dtype) for p in parts], dim=0)
    return QuantizedWeight(torch.cat([p.codes for p in parts], dim=0), scale, zero_point, first.args,
                           _shared_input_scale(parts, where))


def _shared_input_scale(parts: list[QuantizedWeight], where: str) -> torch.Tensor | None:
    """The shards of a fused layer read the same input, so they take one static scale: the
    largest, as vLLM does, so that no shard's calibrated range is clipped."""
    scales = [p.input_scale for p in parts]
    if all(s is None for s in scales):
        return None
    if any(s is None for s in scales):
        raise CheckpointError(f"only some parts of {where} have an input_scale")
    return torch.stack([s.reshape(()) for s in scales]).amax().reshape(1)
