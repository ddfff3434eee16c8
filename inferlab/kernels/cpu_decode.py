"""Decode batches on CPU, one C call per decoder layer (inferlab/kernels/cpu/decode_layer.c).

When every sequence in the batch brings one new token, the model is bf16 and its linears are
packed for the C kernels, a layer is ten kernel calls with nothing to decide between them; the
C function makes them in the order the Python layer does, so outputs are identical, and the
~200 us per layer of Python, tensor views and ctypes between them go away.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch
from torch import nn

from inferlab.kernels import cpu_ops
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.cpu_linear import PackedLinear

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _LayerWeights(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("input_norm", "post_norm", "qkv", "qkv_bias", "o",
                                        "gate_up", "down", "k_cache", "v_cache")]


class _DecodeBatch(ctypes.Structure):
    _fields_ = [*((name, _I64) for name in ("hidden", "num_heads", "num_kv_heads", "head_dim",
                                            "intermediate", "block_size", "table_stride")),
                ("eps", _F32), ("scale", _F32),
                *((name, _P) for name in ("positions", "slots", "cos_table", "sin_table",
                                          "block_tables", "seq_lens"))]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _layer_fits(layer: nn.Module) -> bool:
    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    return (attn.q_norm is None and all(type(m) is PackedLinear for m in linears)
            and all(m.bias is None for m in linears[1:])
            and attn.num_heads // attn.num_kv_heads <= 64 and attn.head_dim % 2 == 0
            and attn.head_dim <= 512)


def fits(layers: Sequence[nn.Module], x: torch.Tensor, kv_caches: Sequence[tuple],
         meta: AttentionMetadata) -> bool:
    """Whether this forward can take the C path: CPU, bf16, decodes only, packed layers."""
    block_size = meta.block_size
    return (x.device.type == "cpu" and x.dtype == torch.bfloat16 and x.dim() == 2
            and len(meta.decode_seqs) == meta.num_seqs == x.shape[0]
            and block_size & (block_size - 1) == 0 and cpu_ops.decode_layer_available()
            and all(k.is_contiguous() and v.is_contiguous() and k.dtype == torch.bfloat16
                    for k, v in kv_caches)
            and all(_layer_fits(layer) for layer in layers))


def run_layers(layers: Sequence[nn.Module], rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
               x: torch.Tensor, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, H] embeddings -> (last layer's MLP output, the residual stream before it)."""
    positions, cos, sin = rope
    positions, slots = positions.to(torch.int64).contiguous(), meta.slot_mapping.contiguous()
    x = x.contiguous()
    residual = torch.empty_like(x)
    first = layers[0]
    attn = first.self_attn
    batch = _DecodeBatch(
        hidden=x.shape[1], num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim, intermediate=first.mlp.down_proj.in_features,
        block_size=meta.block_size, table_stride=meta.block_tables.stride(0),
        eps=first.input_layernorm.eps, scale=attn.scale, positions=_ptr(positions),
        slots=_ptr(slots), cos_table=_ptr(cos), sin_table=_ptr(sin),
        block_tables=_ptr(meta.block_tables), seq_lens=_ptr(meta.seq_lens))
    decode_layer = cpu_ops.decode_layer_function()
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(layers, kv_caches, strict=True)):
        attn, mlp = layer.self_attn, layer.mlp
        weights = _LayerWeights(
            _ptr(layer.input_layernorm.weight), _ptr(layer.post_attention_layernorm.weight),
            _ptr(attn.qkv_proj.packed), _ptr(attn.qkv_proj.bias), _ptr(attn.o_proj.packed),
            _ptr(mlp.gate_up_proj.packed), _ptr(mlp.down_proj.packed), _ptr(k_cache),
            _ptr(v_cache))
        status = decode_layer(x.data_ptr(), residual.data_ptr(), int(i == 0), x.shape[0],
                              ctypes.byref(weights), ctypes.byref(batch))
        if status:
            raise MemoryError("the C decode layer could not allocate its scratch memory")
    return x, residual
