"""Memory formulas: one place, used by the planner and by the engine to size its KV cache."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, replace

from inferlab.errors import InferlabError
from inferlab.models.config import ModelConfig
from inferlab.planner.names import unknown_name_message

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
               "fp8": 1, "float8_e4m3fn": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})") from None


def kv_cache_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                             bytes_per_element: int) -> int:
    """K and V, for every layer: 2 × layers × kv_heads × head_dim × bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * bytes_per_element


def num_kv_blocks(kv_cache_bytes: int, block_size: int, bytes_per_token: int) -> int:
    """Whole blocks of `block_size` tokens that fit in `kv_cache_bytes`."""
    return kv_cache_bytes // (block_size * bytes_per_token)


# --- weights -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WeightFormat:
    """How the linear layers of the transformer blocks are stored; embeddings, lm_head and norms
    stay in `dense_dtype` (quantizers leave them alone: they are sensitive and a small share)."""

    name: str
    bits: int  # bits per stored linear weight
    group_size: int | None  # input columns sharing one scale; None: one scale per output row
    has_scales: bool  # float formats need none
    compute_dtype: str  # the dtype the matmuls run in: picks the hardware's peak FLOP/s
    dense_dtype: str = "bf16"
    scale_bytes: int = 2  # bf16/fp16 scales, as GPTQ, AWQ and compressed-tensors store them
    symmetric: bool = True  # False: an integer zero point beside each scale

    def __post_init__(self) -> None:
        if self.bits not in (4, 8, 16, 32):
            raise InferlabError(f"weight format {self.name}: bits must be 4, 8, 16 or 32")
        if self.group_size is not None and self.group_size <= 0:
            raise InferlabError(f"weight format {self.name}: group size must be positive")


WEIGHT_FORMATS = {
    "fp32": WeightFormat("fp32", 32, None, False, "fp32", dense_dtype="fp32"),
    "fp16": WeightFormat("fp16", 16, None, False, "fp16", dense_dtype="fp16"),
    "bf16": WeightFormat("bf16", 16, None, False, "bf16"),
    # W8A8: activations quantized per token at run time, so the matmuls run at fp8/int8 rate
    "fp8": WeightFormat("fp8", 8, None, True, "fp8"),
    "int8": WeightFormat("int8", 8, None, True, "int8"),
    # weight-only: dequantized inside the matmul, which runs in bf16
    "int8-wo": WeightFormat("int8-wo", 8, None, True, "bf16"),
}
ASYMMETRIC = "-asym"  # the suffix of a weight-only format with zero points
_INT4 = re.compile(r"^int4-g(\d+)$")


def weight_format(name: str) -> WeightFormat:
    """A name from WEIGHT_FORMATS, or `int4-g<group size>` (weight-only, bf16 scales); a
    weight-only name (int8-wo, int4-g…) ending in `-asym` has zero points too."""
    lower = name.lower()
    base = lower.removesuffix(ASYMMETRIC)
    match = _INT4.match(base)
    if match:
        fmt = WeightFormat(base, 4, int(match.group(1)), True, "bf16")
    elif base in WEIGHT_FORMATS:
        fmt = WEIGHT_FORMATS[base]
    else:
        valid = [*WEIGHT_FORMATS, "int4-g128", "int4-g64", "int4-g32", "int4-g128-asym", "int8-wo-asym"]
        raise InferlabError(unknown_name_message("weight format", name, valid))
    if base == lower:
        return fmt
    if fmt.compute_dtype != "bf16" or not fmt.has_scales:
        raise InferlabError(f"weight format {name!r}: only weight-only formats (int8-wo, int4-g…) "
                            "take zero points")
    return replace(fmt, name=lower, symmetric=False)


def block_linear_shapes(model: ModelConfig) -> list[tuple[int, int]]:
    """(in_features, out_features) of each linear layer in one transformer block."""
    h, i = model.hidden_size, model.intermediate_size
    return [(h, model.q_size), (h, model.kv_size), (h, model.kv_size), (model.q_size, h),
            (h, i), (h, i), (i, h)]  # q k v o, gate up down


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of the weights, split into the factors a reader can check by hand."""

    quantized_params: int  # linear weights of the blocks, in `format`
    packed_bytes: int  # quantized_params × bits / 8
    num_scales: int  # one per output row, or per row and group of `group_size` input columns
    scale_bytes: int  # num_scales × bytes per scale
    # asymmetric: one zero point per scale, `bits` wide, packed into int32 words down the output
    # rows of each group column (compressed-tensors' pack-quantized, as vLLM holds them too)
    zero_point_bytes: int
    dense_params: int  # embeddings, lm_head, norms, biases: kept in the dense dtype
    dense_bytes: int
    format: str

    @property
    def total_bytes(self) -> int:
        return self.packed_bytes + self.scale_bytes + self.zero_point_bytes + self.dense_bytes

    @property
    def total_params(self) -> int:
        return self.quantized_params + self.dense_params


def weight_bytes(model: ModelConfig, fmt: WeightFormat) -> WeightBytes:
    shapes = block_linear_shapes(model)
    quantized = model.num_layers * sum(n_in * n_out for n_in, n_out in shapes)
    # scale columns per layer: one, or one per group of inputs (a partial last group has its own)
    columns = [1 if fmt.group_size is None else -(-n_in // fmt.group_size) for n_in, _ in shapes]
    outputs = [n_out for _, n_out in shapes]
    scales = model.num_layers * sum(map(operator.mul, outputs, columns)) if fmt.has_scales else 0
    zero_point_words = model.num_layers * sum(-(-n_out * fmt.bits // 32) * c
                                              for n_out, c in zip(outputs, columns, strict=True))
    dense = model.num_parameters() - quantized
    return WeightBytes(
        quantized_params=quantized,
        packed_bytes=quantized * fmt.bits // 8,
        num_scales=scales,
        scale_bytes=scales * fmt.scale_bytes,
        zero_point_bytes=0 if fmt.symmetric else 4 * zero_point_words,
        dense_params=dense,
        dense_bytes=dense * dtype_bytes(fmt.dense_dtype),
        format=fmt.name,
    )
