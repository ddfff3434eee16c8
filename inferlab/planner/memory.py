"""Memory formulas: one place, used by the planner and by the engine to size its KV cache."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from inferlab.engine.block_manager import cdiv
from inferlab.errors import InferlabError
from inferlab.models.config import ModelConfig
from inferlab.models.fused_layers import FUSED_SHARDS, shard_rows
from inferlab.planner.names import unknown_name_message
from inferlab.quant.ct_config import matches

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
    """How the linear layers are stored: those `targets` name and `ignore` does not (as
    compressed-tensors matches them: 'Linear', a module name or a 're:' regex); embeddings,
    norms and the other linears stay in `dense_dtype`. By default the blocks' linears, not
    lm_head: quantizers leave it alone, as it is sensitive."""

    name: str
    bits: int  # bits per stored linear weight
    group_size: int | None  # input columns sharing one scale; None: all of a row's
    has_scales: bool  # float formats need none
    compute_dtype: str  # the dtype the matmuls run in: picks the hardware's peak FLOP/s
    dense_dtype: str = "bf16"
    scale_bytes: int = 2  # bf16/fp16 scales, as GPTQ, AWQ and compressed-tensors store them
    symmetric: bool = True  # False: an integer zero point beside each scale
    scale_rows: int | None = 1  # output rows sharing one scale; None: all (one per tensor)
    input_scales: bool = False  # static activations: one more scale per layer, for its input
    targets: tuple[str, ...] = ("Linear",)
    ignore: tuple[str, ...] = ("lm_head",)
    # (parameter name, GGUF type) of each weight of a GGUF file the engine holds as its blocks'
    # codes (gguf_held.py); the fields above then go unused
    gguf_types: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if self.bits not in (4, 8, 16, 32):
            raise InferlabError(f"weight format {self.name}: bits must be 4, 8, 16 or 32")
        if any(n is not None and n <= 0 for n in (self.group_size, self.scale_rows)):
            raise InferlabError(f"weight format {self.name}: group size and scale rows must be positive")

    def stores(self, layer: str) -> bool:
        """Whether linear layer `layer` (its Hugging Face name) is held in this format."""
        return (not any(matches(layer, pattern) for pattern in self.ignore)
                and any(matches(layer, target) for target in self.targets))


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


def block_linears(model: ModelConfig) -> list[tuple[str, int, int]]:
    """(name in the block, in_features, out_features) of each linear layer of a block, as a
    checkpoint stores them: the fused layers as their shards."""
    h, i = model.hidden_size, model.intermediate_size
    return [*_shards(model, "self_attn", "qkv_proj"), ("self_attn.o_proj", model.q_size, h),
            *_shards(model, "mlp", "gate_up_proj"), ("mlp.down_proj", i, h)]


def _shards(model: ModelConfig, parent: str, fused: str) -> list[tuple[str, int, int]]:
    """(name in the block, in_features, out_features) of each shard of fused layer `fused`,
    all of which read the hidden state."""
    return [(f"{parent}.{name}", model.hidden_size, rows)
            for name, rows in zip(FUSED_SHARDS[fused], shard_rows(model, fused), strict=True)]


def block_linear_params(model: ModelConfig) -> int:
    """Weights of the blocks' linear layers, all blocks: what each token multiplies by."""
    return model.num_layers * sum(n_in * n_out for _, n_in, n_out in block_linears(model))


KV_PROJ = ("self_attn.k_proj", "self_attn.v_proj")  # their names in a block


def kv_proj_params(model: ModelConfig) -> int:
    """Weights of k_proj and v_proj, all blocks."""
    return model.num_layers * sum(n_in * n_out for name, n_in, n_out in block_linears(model)
                                  if name in KV_PROJ)


def linear_layers(model: ModelConfig) -> list[tuple[str, int, int]]:
    """(Hugging Face name, in_features, out_features) of every linear layer a checkpoint may
    quantize: the blocks', and an untied lm_head (a tied one is the embedding table)."""
    layers = [(f"model.layers.{index}.{name}", n_in, n_out) for index in range(model.num_layers)
              for name, n_in, n_out in block_linears(model)]
    head = [] if model.tie_word_embeddings else [("lm_head", model.hidden_size, model.vocab_size)]
    return layers + head


@dataclass(frozen=True)
class WeightBytes:
    """Bytes of the weights, split into the factors a reader can check by hand."""

    quantized_params: int  # weights of the linear layers stored in `format`
    packed_bytes: int  # quantized_params × bits / 8
    num_scales: int  # one per output row, group of inputs, block or tensor, as `format` says
    scale_bytes: int  # num_scales × bytes per scale
    # asymmetric: one zero point per scale, `bits` wide, packed into int32 words down the output
    # rows of each group column (compressed-tensors' pack-quantized, as vLLM holds them too)
    zero_point_bytes: int
    dense_params: int  # embeddings, norms, biases, linears left dense: in the dense dtype
    dense_bytes: int
    format: str
    # of total_bytes, the k_proj and v_proj weights (scales, zero points, biases too): a device
    # holds whole KV heads, so tensor parallel past the KV heads replicates these
    kv_proj_bytes: int
    # a GGUF file's weights as held (gguf_held.py): (how, params, bytes) for each way, the
    # zero points above then the 4-bit codes' fp32 offsets
    held: tuple[tuple[str, int, int], ...] = ()

    @property
    def total_bytes(self) -> int:
        """The weights' own bytes, as stored (and read)."""
        return self.packed_bytes + self.scale_bytes + self.zero_point_bytes + self.dense_bytes

    @property
    def total_params(self) -> int:
        return self.quantized_params + self.dense_params


def _check_groups(fmt: WeightFormat, widths: set[int]) -> None:
    """Groups must tile each stored layer's `widths` (inputs), as `inferlab quantize` requires
    (a block grid, whose last blocks may be partial, need not)."""
    group = fmt.group_size
    if group is None or fmt.scale_rows != 1 or all(n % group == 0 for n in widths):
        return
    width = min(n for n in widths if n % group)
    divisors = [g for g in (256, 128, 64, 32, 16) if all(n % g == 0 for n in widths)]
    hint = f" (try {fmt.name.replace(f'-g{group}', f'-g{divisors[0]}', 1)})" if divisors else ""
    raise InferlabError(f"weight format {fmt.name}: group size {group} does not divide the "
                        f"model's {width} inputs{hint}")


def _quantized_bytes(fmt: WeightFormat, stored: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(packed weight bytes, scales, zero point bytes) of the linears `stored` in `fmt`, as
    (in_features, out_features)."""
    packed = sum(n_in * n_out for n_in, n_out in stored) * fmt.bits // 8
    # the scale grid of each layer: output rows × input columns sharing one scale
    grids = [(cdiv(n_out, fmt.scale_rows or n_out), cdiv(n_in, fmt.group_size or n_in))
             for n_in, n_out in stored]
    input_scales = 1 if fmt.input_scales else 0
    scales = sum(rows * columns + input_scales for rows, columns in grids) if fmt.has_scales else 0
    zero_point_words = sum(cdiv(rows * fmt.bits, 32) * columns for rows, columns in grids)
    return packed, scales, 0 if fmt.symmetric else 4 * zero_point_words


def _kv_proj_bytes(model: ModelConfig, fmt: WeightFormat) -> int:
    """k_proj and v_proj of every layer as `fmt` holds them, with their biases (dense)."""
    kv_layers = [(name, n_in, n_out) for name, n_in, n_out in linear_layers(model)
                 if name.endswith(KV_PROJ)]
    packed, scales, zero_points = _quantized_bytes(
        fmt, [(n_in, n_out) for name, n_in, n_out in kv_layers if fmt.stores(name)])
    dense = sum(n_in * n_out for name, n_in, n_out in kv_layers if not fmt.stores(name))
    biases = 2 * model.num_layers * model.kv_size if model.attention_bias else 0
    return packed + scales * fmt.scale_bytes + zero_points + (dense + biases) * dtype_bytes(fmt.dense_dtype)


def weight_bytes(model: ModelConfig, fmt: WeightFormat) -> WeightBytes:
    if fmt.gguf_types:
        from inferlab.planner.gguf_held import gguf_held_weight_bytes

        return gguf_held_weight_bytes(model, fmt)
    stored = [(n_in, n_out) for name, n_in, n_out in linear_layers(model) if fmt.stores(name)]
    _check_groups(fmt, {n_in for n_in, _ in stored})
    quantized = sum(n_in * n_out for n_in, n_out in stored)
    packed, scales, zero_points = _quantized_bytes(fmt, stored)
    dense = model.num_parameters() - quantized
    return WeightBytes(
        quantized_params=quantized,
        packed_bytes=packed,
        num_scales=scales,
        scale_bytes=scales * fmt.scale_bytes,
        zero_point_bytes=zero_points,
        dense_params=dense,
        dense_bytes=dense * dtype_bytes(fmt.dense_dtype),
        format=fmt.name,
        kv_proj_bytes=_kv_proj_bytes(model, fmt),
    )
