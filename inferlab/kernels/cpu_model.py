"""The whole model's forward on CPU in one C call (inferlab/kernels/cpu/model_forward.c,
model_forward_f32.c).

When the model is bf16 and its linears are packed for the C kernels (bf16, W8A16, W4A16, W8A8 or
FP8), a layer is about ten kernel calls with nothing to decide between them, whatever mix of
prompts and decode tokens the batch holds; the C function makes them in the order the Python
layer does, so outputs are identical, and the ~200 us per layer of Python, tensor views and
ctypes between them go away. So too for fp32 models whose linears avx2_quant_linear.c runs (dense
fp32, W8A16, W4A16) on decode batches within those kernels' row limits.
"""

from __future__ import annotations

import ctypes
import operator
import sys
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from inferlab.kernels import cpu_library, cpu_ops
from inferlab.kernels.attention.cpu_paged import decode_rows, prefill_seqs
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.avx2_fp32_linear import KeptAvx2Desc
from inferlab.kernels.cpu_library import tensor_ptr
from inferlab.kernels.cpu_linear import CLinear, PackedEmbedding

_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_LINEARS = ("qkv", "o", "gate_up", "down")
# layer -> (the objects its C struct points into, the struct): the objects are held, so no
# pointer in a cached struct outlives its tensor
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# LlamaModel -> _Plan: what run_model needs from it, checked in O(1) a step
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_registrations = 0  # submodules, parameters and buffers set on any module since import


def _count_registration(*_args: object) -> None:
    global _registrations
    _registrations += 1


# Any setattr of a module, parameter or buffer, anywhere, marks every plan stale (the next step
# checks its layers one by one again): cheaper than looking at 30 layers' modules every step,
# which costs ~0.2 ms of a ~4 ms single-row step once the weights have flushed the caches.
for _register in (torch.nn.modules.module.register_module_module_registration_hook,
                  torch.nn.modules.module.register_module_parameter_registration_hook,
                  torch.nn.modules.module.register_module_buffer_registration_hook):
    _register(_count_registration)


class _LayerWeights(ctypes.Structure):
    """model_forward.c's layer_weights_t (bf16)."""

    _fields_ = [("input_norm", _P), ("post_norm", _P),
                *((name, cpu_library.LinearDesc) for name in _LINEARS),
                ("k_cache", _P), ("v_cache", _P)]


class _F32LayerWeights(ctypes.Structure):
    """model_forward_f32.c's f32_layer_t."""

    _fields_ = [("input_norm", _P), ("post_norm", _P),
                *((name, cpu_library.Avx2QuantDesc) for name in _LINEARS),
                ("k_cache", _P), ("v_cache", _P)]


class _ForwardBatch(ctypes.Structure):
    _fields_ = [*((name, _I64) for name in ("hidden", "num_heads", "num_kv_heads", "head_dim",
                                            "intermediate", "block_size", "table_stride", "vocab",
                                            "embed_packed")),
                ("eps", _F32), ("final_eps", _F32), ("scale", _F32),
                *((name, _P) for name in ("token_ids", "positions", "slots", "cos_table", "sin_table",
                                          "block_tables", "seq_lens", "query_start_loc",
                                          "decode_rows", "decode_seqs", "prefill_seqs")),
                ("num_decodes", _I64), ("num_prefills", _I64),
                *((name, _P) for name in ("embed", "final_norm", "embed_codes"))]


class _Plan(NamedTuple):
    registrations: int  # _registrations when it was built
    kv_caches: tuple  # the (k, v) pairs it was built for
    layers: ctypes.Array  # each layer's _LayerWeights or _F32LayerWeights, in order
    model_fields: dict  # the model's fields of _ForwardBatch (sizes, eps, scale, tables)
    max_rows: int  # the most rows every linear's C kernel takes (the Python layer's own limit)
    takes_prompts: bool  # whether the C function runs prompts' attention too
    embed_desc: object  # the tied head's codes' description embed_codes points at (kept alive), or None


def _linears(layer: nn.Module) -> tuple[nn.Module, ...]:
    """qkv, o, gate_up, down, read from `_modules` directly: nn.Module's attribute lookup costs
    about a microsecond."""
    attn, mlp = layer._modules["self_attn"], layer._modules["mlp"]
    return (attn._modules["qkv_proj"], attn._modules["o_proj"], mlp._modules["gate_up_proj"],
            mlp._modules["down_proj"])


def _layer_weights(layer: nn.Module, k_cache: torch.Tensor, v_cache: torch.Tensor
                   ) -> ctypes.Structure | None:
    """The layer's tensors for the C call, or None when the layer does not fit the C path.
    Built once per layer and reused while the same modules, norm weights and caches are in
    place (building costs ~25 us a layer, ~0.8 ms a step)."""
    parts = (*_linears(layer), layer._modules["input_layernorm"]._parameters["weight"],
             layer._modules["post_attention_layernorm"]._parameters["weight"], k_cache, v_cache)
    cached = _BUILT.get(layer)
    if cached is not None and all(map(operator.is_, cached[0], parts)):
        return cached[1]
    weights = _build_layer_weights(layer._modules["self_attn"], parts)
    _BUILT[layer] = (parts, weights)
    return weights


def _build_layer_weights(attn: nn.Module, parts: tuple) -> ctypes.Structure | None:
    """bf16 layers whose linears are CLinear, fp32 ones whose linears avx2_quant_linear.c runs."""
    *linears, norm, post_norm, k_cache, v_cache = parts
    dtype = k_cache.dtype
    if not (attn.q_norm is None and cpu_ops.rotary_fits(attn.head_dim)
            and k_cache.is_contiguous() and v_cache.is_contiguous()
            and v_cache.dtype == norm.dtype == post_norm.dtype == dtype):
        return None
    if dtype == torch.bfloat16 and all(isinstance(m, CLinear) for m in linears):
        layer_type = _LayerWeights
    elif dtype == torch.float32 and all(isinstance(m, KeptAvx2Desc) for m in linears):
        layer_type = _F32LayerWeights
    else:
        return None
    return layer_type(tensor_ptr(norm), tensor_ptr(post_norm), *(m.c_desc() for m in linears),
                      tensor_ptr(k_cache), tensor_ptr(v_cache))


def run_model(model: nn.Module, input_ids: torch.Tensor,
              rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
              kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]],
              meta: AttentionMetadata) -> torch.Tensor | None:
    """The LlamaModel's forward for input_ids [M] -> final hidden states [M, H], or None when
    this forward does not fit the C path (not CPU bf16 or fp32, a layer the C function does not
    implement, more rows than a linear's kernel takes, prompts the C function does not take):
    the caller then runs its Python layers."""
    block_size = meta.block_size
    dtype = model.norm.weight.dtype
    if not (input_ids.device.type == "cpu" and input_ids.dim() == 1
            and block_size & (block_size - 1) == 0 and cpu_ops.model_forward_available(dtype)):
        return None
    plan = _plan(model, kv_caches)
    all_decodes = len(meta.decode_seqs) == meta.num_seqs == input_ids.shape[0]
    if plan is None or input_ids.shape[0] > plan.max_rows or not (all_decodes or plan.takes_prompts):
        return None
    positions, cos, sin = rope
    ids, positions = input_ids.to(torch.int64).contiguous(), positions.to(torch.int64).contiguous()
    slots = meta.slot_mapping.contiguous()
    out = torch.empty(ids.shape[0], plan.model_fields["hidden"], dtype=dtype)
    residual = torch.empty_like(out)
    rows, seqs = decode_rows(meta)
    prompts = None if all_decodes else prefill_seqs(meta)
    batch = _ForwardBatch(
        **plan.model_fields, block_size=block_size, table_stride=meta.block_tables.stride(0),
        token_ids=tensor_ptr(ids), positions=tensor_ptr(positions), slots=tensor_ptr(slots),
        cos_table=tensor_ptr(cos), sin_table=tensor_ptr(sin),
        block_tables=tensor_ptr(meta.block_tables), seq_lens=tensor_ptr(meta.seq_lens),
        query_start_loc=tensor_ptr(meta.query_start_loc), decode_rows=tensor_ptr(rows),
        decode_seqs=tensor_ptr(seqs), prefill_seqs=tensor_ptr(prompts), num_decodes=len(meta.decode_seqs),
        num_prefills=meta.num_seqs - len(meta.decode_seqs))
    status = cpu_ops.model_forward_function(dtype)(out.data_ptr(), residual.data_ptr(), out.shape[0],
                                                   plan.layers, len(plan.layers), ctypes.byref(batch))
    if status == -3:
        raise IndexError(f"a token id outside the embedding table (0..{plan.model_fields['vocab'] - 1})")
    if status == -4:  # run_model sends the fp32 function decode rows only
        raise RuntimeError("the fp32 C model forward was given prompt rows")
    if status:
        raise MemoryError("the C model forward could not allocate its scratch memory")
    return out


class _EmbeddingRows(NamedTuple):
    """Where the C path reads the embedding's rows."""

    fields: dict  # _ForwardBatch's embed, embed_packed and embed_codes
    dtype: torch.dtype  # the rows'
    desc: object  # the tied head's codes' description embed_codes points at, or None


def _embedding_rows(embedding: nn.Module) -> _EmbeddingRows | None:
    """Its weight, a tied head's packed weight, or a tied head's codes (fp32, through the
    head's C description); None when the C path cannot read them."""
    if isinstance(embedding, PackedEmbedding) and embedding.codes_desc is not None:
        desc = embedding.codes_desc()
        return _EmbeddingRows(dict(embed=None, embed_packed=0, embed_codes=ctypes.addressof(desc)),
                              torch.float32, desc)
    packed = isinstance(embedding, PackedEmbedding)
    table = embedding.packed if packed else embedding.weight
    if not table.is_contiguous():
        return None
    return _EmbeddingRows(dict(embed=tensor_ptr(table), embed_packed=int(packed), embed_codes=None),
                          table.dtype, None)


def _plan(model: nn.Module, kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> _Plan | None:
    """The cached plan while no module anywhere was set anew and the caches are the same
    pairs; else one built from each layer's _layer_weights, or None when a layer does not fit
    the C path."""
    plan = _PLANS.get(model)
    if (plan is not None and plan.registrations == _registrations
            and len(plan.kv_caches) == len(kv_caches) and all(map(operator.is_, plan.kv_caches, kv_caches))):
        return plan
    layers, embedding, norm = model.layers, model.embed_tokens, model.norm
    embed = _embedding_rows(embedding)
    weights = [_layer_weights(layer, k, v) for layer, (k, v) in zip(layers, kv_caches, strict=True)]
    layer_type = _LayerWeights if norm.weight.dtype == torch.bfloat16 else _F32LayerWeights
    if not (embed is not None and embed.dtype == norm.weight.dtype
            and all(isinstance(w, layer_type) for w in weights)):
        return None
    first = layers[0]
    attn = first.self_attn
    fields = dict(hidden=embedding.embedding_dim, num_heads=attn.num_heads,
                  num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim,
                  intermediate=first.mlp.down_proj.in_features, vocab=embedding.num_embeddings,
                  eps=first.input_layernorm.eps, final_eps=norm.eps, scale=attn.scale,
                  final_norm=tensor_ptr(norm.weight), **embed.fields)
    max_rows = min(getattr(m, "kernel_max_rows", sys.maxsize) for layer in layers for m in _linears(layer))
    takes_prompts = norm.weight.dtype == torch.bfloat16 and cpu_ops.prefill_head_dim_fits(attn.head_dim)
    plan = _Plan(_registrations, tuple(kv_caches), (layer_type * len(weights))(*weights), fields,
                 max_rows, takes_prompts, embed.desc)
    _PLANS[model] = plan
    return plan
