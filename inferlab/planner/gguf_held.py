"""A GGUF model's weights as the engine holds them where it runs fp32 through its AVX2 linears
(a CPU with AVX2 and FMA but neither AMX nor AVX512-BF16; inferlab/kernels/avx2_fp32_linear.py):
a linear whose file blocks are Q4_0, Q4_1 or Q8_0 as those codes, 8 outputs a block, with an
fp32 scale per 32 inputs (4-bit codes: and an fp32 offset); a decoder linear whose tensors are
BF16 as bf16 (the head narrows to codes only); the rest fp32. A fused layer (q/k/v, gate/up)
narrows only where its parts share one type. A tied embedding reads the head's copy.

The embedded SmolLM2-135M (Q4_1 decoder, Q8_0 tied embedding) is held in 112 MB this way
against 538 MB of fp32; costed as fp32, the plan's batch-1 step was 3.5x the engine's."""

from __future__ import annotations

from collections import Counter

from inferlab.engine.block_manager import cdiv
from inferlab.models.config import ModelConfig
from inferlab.models.fused_layers import FUSED_SHARDS
from inferlab.models.gguf import check_gguf_tensors, open_gguf
from inferlab.models.gguf_reader import is_gguf_file
from inferlab.planner.memory import KV_PROJ, WeightBytes, WeightFormat, block_linears

CODE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}  # GGUF block types held as their codes
CODE_BLOCK = 32  # inputs a scale (and an offset) covers
OUTPUT_LANES = 8  # outputs a block of codes holds: a layer's rows are held up to a multiple
FP32, BF16 = "fp32", "bf16"


def held_format(source: str, dense_dtype: str) -> WeightFormat | None:
    """The format to plan `source` with on this CPU if it is a GGUF file whose weights the
    engine holds as above (fp32 through the AVX2 linears, built where the compiler targets AVX2
    and FMA): the type of each weight tensor the file holds, by Hugging Face name."""
    from inferlab.engine.platform import cpu_flags

    if dense_dtype != FP32 or not {"avx2", "fma"} <= cpu_flags() or not is_gguf_file(source):
        return None
    types = tuple((name, tensor.type_name) for name, tensor in check_gguf_tensors(source, open_gguf(source))
                  if name.endswith(".weight"))
    return WeightFormat("gguf", 32, None, False, FP32, dense_dtype=FP32, gguf_types=types)


def _held(types: list[str], head: bool) -> str:
    """How a layer whose parts have these GGUF types is held: a code type, bf16 or fp32."""
    kinds = set(types)
    if len(kinds) == 1 and types[0] in CODE_BITS:
        return types[0]
    return BF16 if kinds == {"BF16"} and not head else FP32


def layer_bytes(held: str, n_in: int, n_out: int) -> tuple[int, int, int]:
    """(code bytes, scales, offset bytes) of a layer held as a code type; (dense bytes, 0, 0)
    else."""
    if held not in CODE_BITS:
        return n_in * n_out * (2 if held == BF16 else 4), 0, 0
    rows = cdiv(n_out, OUTPUT_LANES) * OUTPUT_LANES
    scales = rows * cdiv(n_in, CODE_BLOCK)
    return rows * n_in * CODE_BITS[held] // 8, scales, 4 * scales if CODE_BITS[held] == 4 else 0


def _parts(shard: str) -> list[str]:
    """The shards of the layer the engine builds `shard` into ('self_attn.k_proj' -> q, k, v)."""
    parent, _, leaf = shard.rpartition(".")
    group = next((names for names in FUSED_SHARDS.values() if leaf in names), (leaf,))
    return [f"{parent}.{name}" for name in group]


def _layers(model: ModelConfig, types: dict[str, str]) -> list[tuple[str, str, int, int]]:
    """(name, how held, in_features, out_features) of each linear, a fused layer's shards each
    as the fused layer is held, and the head (the embedding table where tied)."""
    layers = []
    for index in range(model.num_layers):
        prefix = f"model.layers.{index}."
        for shard, n_in, n_out in block_linears(model):
            held = _held([types.get(f"{prefix}{part}.weight", FP32) for part in _parts(shard)], head=False)
            layers.append((prefix + shard, held, n_in, n_out))
    head = "model.embed_tokens.weight" if model.tie_word_embeddings else "lm_head.weight"
    layers.append(("lm_head", _held([types.get(head, FP32)], head=True), model.hidden_size, model.vocab_size))
    return layers


def gguf_held_weight_bytes(model: ModelConfig, fmt: WeightFormat) -> WeightBytes:
    """The bytes the engine holds `fmt.gguf_types`' weights in: its linears as _layers says, an
    untied embedding table, the norms and biases in fp32."""
    layers = _layers(model, dict(fmt.gguf_types))
    packed = scales = offsets = dense_bytes = coded = kv_bytes = 0
    by_kind: Counter[str] = Counter()
    by_kind_bytes: Counter[str] = Counter()
    for name, held, n_in, n_out in layers:
        main, layer_scales, layer_offsets = layer_bytes(held, n_in, n_out)
        total = main + 4 * layer_scales + layer_offsets
        by_kind[held] += n_in * n_out
        by_kind_bytes[held] += total
        if held in CODE_BITS:
            coded += n_in * n_out
            packed, scales, offsets = packed + main, scales + layer_scales, offsets + layer_offsets
        else:
            dense_bytes += main
        if name.endswith(KV_PROJ):
            kv_bytes += total
    # an untied embedding table, norms, biases: fp32 (a tied table is the head's, counted there)
    other = model.num_parameters() - sum(n_in * n_out for _, _, n_in, n_out in layers)
    by_kind[FP32] += other
    by_kind_bytes[FP32] += 4 * other
    biases = 2 * model.num_layers * model.kv_size if model.attention_bias else 0
    return WeightBytes(
        quantized_params=coded, packed_bytes=packed, num_scales=scales, scale_bytes=4 * scales,
        zero_point_bytes=offsets, dense_params=model.num_parameters() - coded,
        dense_bytes=dense_bytes + 4 * other, format=fmt.name, kv_proj_bytes=kv_bytes + 4 * biases,
        held=tuple((kind, by_kind[kind], by_kind_bytes[kind]) for kind in sorted(by_kind)))
