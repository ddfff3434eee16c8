"""The C kernels of inferlab/kernels/cpu/ (cpu_library.SOURCES) as torch functions: each wrapper
takes CPU tensors of one dtype, bf16 or fp32, and checks the layout it relies on. The library
is built at first use (cpu_library.py); where no compiler works, `available()` is False and
callers keep their torch path. INFERLAB_CPU_KERNELS=0 turns the C kernels off (for A/B
measurements), INFERLAB_CPU_AMX=0 their AMX paths.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence

import torch

from inferlab.kernels import host_memory
from inferlab.kernels.cpu_library import Avx2QuantDesc, LinearDesc
from inferlab.kernels.cpu_library import library as _library

_ELEM = {torch.bfloat16: 2, torch.float32: 4}
MAX_HEAD_DIM = 512  # the rotary kernel's stack buffers


def available(*tensors: torch.Tensor) -> bool:
    """True when the C kernels are built and every tensor is a CPU tensor of one supported dtype."""
    first = tensors[0].dtype
    # the library last: on a GPU machine, CUDA tensors must not cost a C build at first use
    return (first in _ELEM and all(t.device.type == "cpu" and t.dtype == first for t in tensors)
            and _library() is not None)


def _rows_ok(t: torch.Tensor) -> bool:
    """[N, ...] whose trailing dims are one contiguous run per row (any row stride)."""
    if t.dim() == 1:
        return t.is_contiguous()
    return t.shape[0] == 0 or t[0].is_contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as triton_norm_rope.rms_norm; with `residual`, both x and residual are
    overwritten (x with the normalised output, residual with x + residual)."""
    dim = x.shape[-1]
    if weight.numel() != dim:
        raise ValueError(f"rms_norm: {weight.numel()} weights for rows of {dim}")
    if residual is not None:  # written in place: rows of exactly `dim` elements
        x = x.contiguous()
    x2 = x.reshape(-1, dim)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    if residual is None:
        out = torch.empty(x.shape, dtype=x.dtype)
        _library().rms_norm(x2.data_ptr(), x2.stride(0), None, weight.data_ptr(), out.data_ptr(),
                            rows, dim, eps, _ELEM[x.dtype])
        return out
    if not residual.is_contiguous():
        raise ValueError("the fused residual RMSNorm works in place on a contiguous residual")
    _library().rms_norm(x2.data_ptr(), x2.stride(0), residual.data_ptr(), weight.data_ptr(),
                        x2.data_ptr(), rows, dim, eps, _ELEM[x.dtype])
    return x, residual


def rotary_fits(head_dim: int) -> bool:
    """Whether the rotary kernel takes heads of head_dim (its buffers are on the stack)."""
    return head_dim % 2 == 0 and head_dim <= MAX_HEAD_DIM


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as triton_norm_rope.rotary_embedding (in place); cos, sin fp32 tables
    [positions, head_dim]. The positions are trusted to lie within the tables (the engine caps
    max_model_len at the model's positions), as the attention kernels trust their indices."""
    dim = q.shape[-1]
    if not (rotary_fits(dim) and all(t.dtype == torch.float32 and t.is_contiguous()
                                     and t.dim() == 2 and t.shape[1] == dim for t in (cos, sin))):
        raise ValueError(f"rotary kernel needs an even head dim <= {MAX_HEAD_DIM} and fp32 "
                         f"[positions, {dim}] tables, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"rotary tables of {tuple(cos.shape)} and {tuple(sin.shape)}")
    positions = positions.to(torch.int64)
    n, hq, hkv, elem = q.shape[0], q.shape[1], k.shape[1], _ELEM[q.dtype]
    # q and k side by side in one fused projection row: rotate both heads' runs in one call
    adjacent = (k.data_ptr() == q.data_ptr() + hq * dim * elem and q.stride() == k.stride()
                and q.stride(1) == dim)
    parts = [(q, hq + hkv)] if adjacent else [(q, hq), (k, hkv)]
    for x, heads in parts:
        if x.stride(2) != 1 or x.stride(1) != dim:
            raise ValueError("rotary kernel needs heads contiguous within a token")
        _library().rotary(x.data_ptr(), x.stride(0), heads, positions.data_ptr(), cos.data_ptr(),
                          sin.data_ptr(), n, dim, elem)
    return q, k


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v [N, Hkv, D] (any token stride) -> caches [blocks, block_size, Hkv, D] at slots [N]."""
    if not (_rows_ok(k) and _rows_ok(v) and k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("write_kv needs each token's heads contiguous and contiguous caches")
    slots = slot_mapping.to(torch.int64)
    capacity = k_cache.shape[0] * k_cache.shape[1]
    if slots.numel() and int(slots.max()) >= capacity:  # negative slots are skipped (padding)
        raise ValueError(f"write_kv: slot {int(slots.max())} is past the cache's {capacity} slots")
    _library().write_kv(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), slots.data_ptr(),
                        k_cache.data_ptr(), v_cache.data_ptr(), k.shape[0],
                        k.shape[1] * k.shape[2], _ELEM[k.dtype])


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, rows: torch.Tensor,
                           seqs: torch.Tensor, scale: float, out: torch.Tensor) -> None:
    """Rows `rows` of q [N, Hq, D] attend over their sequences' (`seqs`) cached positions
    [0, seq_lens[seq]); results go to the same rows of out [N, Hq, D] (contiguous).
    block_tables [B, W], seq_lens [B], rows, seqs [Bd]: int32."""
    num_heads, dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if block_size & (block_size - 1):
        raise ValueError(f"the C decode attention needs a power-of-two block size, not {block_size}")
    _check_attention("paged_decode_attention", q, k_cache, v_cache, out,
                     (block_tables, seq_lens, rows, seqs))
    status = _library().paged_decode_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), seq_lens.data_ptr(), rows.data_ptr(), seqs.data_ptr(),
        rows.shape[0], out.data_ptr(), num_heads, num_kv_heads, dim, block_size, scale,
        _ELEM[q.dtype])
    if status:
        raise MemoryError("paged_decode_attention could not allocate its scratch buffers")


def _check_attention(name: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     out: torch.Tensor, index: Sequence[torch.Tensor]) -> None:
    """What both paged attention kernels rely on: grouped heads, one head dim, one dtype, the
    layout they read, int32 indices. The indices' values are trusted, as vLLM's kernels trust
    theirs (checking them would cost a pass over the tables a layer): block ids below the
    pool's count, lengths within a table's blocks, at least one position a sequence."""
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
    if k_cache.shape != v_cache.shape or q.shape[2] != k_cache.shape[3] or out.shape != q.shape:
        raise ValueError(f"{name}: q {tuple(q.shape)} and out {tuple(out.shape)} [N, Hq, D] do not "
                         f"match the caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)} [blocks, "
                         f"block_size, Hkv, D]")
    if not (q.dtype == k_cache.dtype == v_cache.dtype == out.dtype):
        raise ValueError(f"{name}: q, the caches and out must share one dtype")
    if not (_rows_ok(q) and q.stride(1) == q.shape[2] and out.is_contiguous()
            and k_cache.is_contiguous() and v_cache.is_contiguous() and index[0].is_contiguous()):
        raise ValueError(f"{name}: unexpected tensor layout")
    if any(t.dtype != torch.int32 for t in index):
        raise ValueError(f"{name}: index tensors must be int32")


def release_openmp_threads() -> bool:
    """Free the calling thread's OpenMP worker threads (ops.c says why); True when freed. Call
    it on a thread that is done running kernels, before another thread starts running them."""
    lib = _library()
    return lib is not None and lib.release_openmp_threads() == 0


def amx_available() -> bool:
    """The kernels may use AMX here: the CPU has it, Linux grants it, INFERLAB_CPU_AMX is not 0."""
    lib = _library()
    return lib is not None and bool(lib.has_amx())


def prefill_attention_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """paged_prefill_attention takes these shapes here: bf16, a power-of-two block size, and a
    head dim prefill_head_dim_fits."""
    return (q.dtype == torch.bfloat16 and k_cache.dtype == torch.bfloat16
            and not k_cache.shape[1] & (k_cache.shape[1] - 1) and prefill_head_dim_fits(q.shape[2]))


def prefill_head_dim_fits(head_dim: int) -> bool:
    """paged_prefill_attention's tiles take this head dim here (a multiple of 32, <= 256)."""
    lib = _library()
    return lib is not None and bool(lib.prefill_attention_fits(head_dim))


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, seqs: torch.Tensor, scale: float,
                            out: torch.Tensor) -> None:
    """The new tokens of sequences `seqs` (rows query_start_loc[b]:query_start_loc[b+1] of q
    [N, Hq, D]) attend causally over their sequences' cache; results to the same rows of out
    [N, Hq, D] (contiguous). block_tables [B, W], query_start_loc [B+1], seq_lens [B], seqs: int32."""
    num_heads, dim = q.shape[1], q.shape[2]
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    _check_attention("paged_prefill_attention", q, k_cache, v_cache, out,
                     (block_tables, query_start_loc, seq_lens, seqs))
    status = _library().paged_prefill_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        block_tables.stride(0), query_start_loc.data_ptr(), seq_lens.data_ptr(), seqs.data_ptr(),
        seqs.shape[0], out.data_ptr(), num_heads, num_kv_heads, dim, block_size, scale)
    if status == -2:
        raise ValueError("paged_prefill_attention: a head dim it does not take")
    if status:
        raise MemoryError("paged_prefill_attention could not allocate its scratch buffers")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[..., 2I] -> [..., I]: silu(gate) * up."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul takes gate and up halves, not a last dim of {x.shape[-1]}")
    inter = x.shape[-1] // 2
    x = x if x.is_contiguous() else x.contiguous()
    out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype)
    _library().silu_and_mul(x.data_ptr(), out.data_ptr(), x.numel() // (2 * inter) if inter else 0,
                            inter, _ELEM[x.dtype])
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for fp32 [B, V] (unit stride along V) on CPU; NaNs are skipped."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or not x.shape[1]:
        raise ValueError(f"argmax takes fp32 [B, V] rows, not {x.dtype} {list(x.shape)}")
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _library().argmax_rows(x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr())
    return out


def sample(logits: torch.Tensor, temperatures: Sequence[float], min_p: Sequence[float],
           uniform: torch.Tensor) -> torch.Tensor:
    """Token ids [B] drawn from softmax(logits / temperatures) without the entries below min_p
    times the row's top probability, by the inverse CDF at `uniform` (as sampler.inverse_cdf).
    logits fp32 [B, V] (unit stride along V); uniform fp64 [B, 1] in [0, 1)."""
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"sample takes fp32 [B, V] rows, not {logits.dtype} {list(logits.shape)}")
    rows, cols = logits.shape
    inv_temp = (ctypes.c_float * rows)(*(1.0 / t for t in temperatures))
    floors = (ctypes.c_float * rows)(*min_p)
    uniform = uniform.to(torch.float64).contiguous()
    out = torch.empty(rows, dtype=torch.int64)
    if _library().sample_rows(logits.data_ptr(), logits.stride(0), rows, cols, inv_temp, floors,
                              uniform.data_ptr(), out.data_ptr()):
        raise MemoryError("sample_rows could not allocate its scratch memory")
    return out


@functools.cache
def _built_with(feature: str) -> bool:
    """True when the library was built and its `has_<feature>()` says the CPU part is there."""
    lib = _library()
    return lib is not None and bool(getattr(lib, f"has_{feature}")())


def bf16_linear_available() -> bool:
    """The AVX512-BF16 linear kernels (matmul.c)."""
    return _built_with("bf16_linear")


def bf16_linear_fits(out_features: int, in_features: int) -> bool:
    """The packed layout's blocks: 16 outputs by 32 inputs."""
    return out_features % 16 == 0 and in_features % 32 == 0 and out_features > 0


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """bf16 weight [N, K] -> the kernels' layout [N/16, K/2, 16, 2] (see matmul.c), in 2 MiB
    pages (host_memory)."""
    n_out, k_in = weight.shape
    if weight.dtype != torch.bfloat16 or not bf16_linear_fits(n_out, k_in):
        raise ValueError(f"pack_bf16 takes bf16 [N, K] with N % 16 == 0 and K % 32 == 0, "
                         f"not {weight.dtype} {list(weight.shape)}")
    weight = weight.contiguous()
    packed = host_memory.empty_in_huge_pages((n_out // 16, k_in // 2, 16, 2), torch.bfloat16)
    _library().pack_bf16_vnni(weight.data_ptr(), packed.data_ptr(), n_out, k_in)
    return packed


def bf16_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x [M, K] @ W^T (+ bias) -> [M, N] with fp32 sums, W packed by pack_bf16; out_dtype bf16
    (the sums rounded once) or float32 (the sums as they are)."""
    rows, k_in = x.shape
    n_out = packed.shape[0] * 16
    if x.stride(1) != 1 or k_in != packed.shape[1] * 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"bf16_linear: x {x.dtype} {list(x.shape)} does not match a packed "
                         f"[{n_out}, {packed.shape[1] * 2}] weight")
    if bias is not None and not (bias.dtype == torch.bfloat16 and bias.is_contiguous()
                                 and bias.numel() == n_out):
        raise ValueError(f"bf16_linear: the bias must be {n_out} contiguous bf16 values")
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"bf16_linear writes bfloat16 or float32, not {out_dtype}")
    y = torch.empty(rows, n_out, dtype=out_dtype)
    if not rows:  # the kernels' tile configuration needs a row
        return y
    status = _library().bf16_linear(x.data_ptr(), x.stride(0), rows, packed.data_ptr(),
                                    None if bias is None else bias.data_ptr(), y.data_ptr(),
                                    _ELEM[out_dtype], n_out, k_in)
    if status:
        raise MemoryError("bf16_linear could not allocate its padding buffer")
    return y


def quant_linear_available() -> bool:
    """The weight-only int8/int4 kernels (quant_linear.c)."""
    return _built_with("quant_linear")


def avx2_quant_linear_available() -> bool:
    """The weight-only int8/int4 kernels for fp32 on AVX2 + FMA (avx2_quant_linear.c)."""
    return _built_with("avx2_quant_linear")


def avx2_quant_linear(x: torch.Tensor, desc: Avx2QuantDesc) -> torch.Tensor:
    """x [M, K] fp32 (unit stride along K) -> fp32 [M, N] (+ the bias) through the layer `desc`
    describes; the caller keeps the tensors behind desc's pointers alive."""
    return _run_kernel("avx2_quant_linear", desc, x)


def avx2_quant_dequantize(desc: Avx2QuantDesc) -> torch.Tensor:
    """The fp32 weight [N, K] of the layer `desc` describes."""
    w = torch.empty(desc.n_out, desc.k_in, dtype=torch.float32)
    _library().avx2_quant_dequantize(ctypes.byref(desc), w.data_ptr())
    return w


def avx2_quant_rows(desc: Avx2QuantDesc, ids: torch.Tensor) -> torch.Tensor:
    """The fp32 rows [len(ids), K] of the weight `desc` describes; ids int64 [n], each in
    0 .. N - 1 (the caller checks: the kernel does not)."""
    ids = ids.contiguous()
    rows = torch.empty(ids.shape[0], desc.k_in, dtype=torch.float32)
    _library().avx2_quant_rows(ctypes.byref(desc), ids.data_ptr(), ids.shape[0], rows.data_ptr())
    return rows


def dynamic_linear_available() -> bool:
    """The W8A8 and FP8_DYNAMIC kernels (dynamic_linear.c: AVX512-BF16 and -VNNI, and AMX where
    the CPU has it)."""
    return _built_with("dynamic_linear") and quant_linear_available()


def _check_rows(name: str, x: torch.Tensor, desc: LinearDesc | Avx2QuantDesc,
                dtype: torch.dtype = torch.bfloat16) -> None:
    if x.dtype != dtype or x.dim() != 2 or x.shape[1] != desc.k_in or x.stride(1) != 1:
        raise ValueError(f"{name} takes {str(dtype).removeprefix('torch.')} [M, {desc.k_in}] rows, "
                         f"not {x.dtype} {list(x.shape)}")


def _kernel_args(name: str, desc: LinearDesc | Avx2QuantDesc,
                 x: torch.Tensor) -> tuple[ctypes._CFuncPtr, tuple, torch.Tensor]:
    """desc's kernel (bf16 rows for a LinearDesc, fp32 for an Avx2QuantDesc), its arguments on x
    [M, K], and the output they write."""
    bf16 = isinstance(desc, LinearDesc)
    _check_rows(name, x, desc, torch.bfloat16 if bf16 else torch.float32)
    y = torch.empty(x.shape[0], desc.n_out, dtype=x.dtype)
    kernel = _library().linear_forward if bf16 else _library().avx2_quant_linear
    return kernel, (ctypes.byref(desc), x.data_ptr(), x.stride(0), x.shape[0], y.data_ptr()), y


def _run_kernel(name: str, desc: LinearDesc | Avx2QuantDesc, x: torch.Tensor) -> torch.Tensor:
    kernel, args, y = _kernel_args(name, desc, x)
    if x.shape[0] and kernel(*args):
        raise MemoryError(f"{name} could not allocate its scratch memory")
    return y


def linear_forward(x: torch.Tensor, desc: LinearDesc) -> torch.Tensor:
    """x [M, K] bf16 (unit stride along K) -> bf16 [M, N] through the layer `desc` describes;
    the caller keeps the tensors behind desc's pointers alive."""
    return _run_kernel("linear_forward", desc, x)


def bound_kernel_call(desc: LinearDesc | Avx2QuantDesc,
                      x: torch.Tensor) -> tuple[Callable[[], int], torch.Tensor]:
    """desc's kernel on x [M, K] with its arguments bound, as the C model forward calls it: no
    module call's Python (~15 us on an Intel Xeon, a fifth of a 576-wide layer at one row).
    Returns the call (the kernel's status) and its output; the caller keeps desc's module alive."""
    kernel, args, y = _kernel_args("the kernel", desc, x)

    def call(_alive: tuple = (x, y)) -> int:  # the tensors behind the pointers live with it
        return kernel(*args)

    return call, y


def glu_forward(x: torch.Tensor, desc: LinearDesc) -> torch.Tensor:
    """silu(gate) * up of a gate_up layer's outputs: x [M, K] -> bf16 [M, N / 2], the bits of
    silu_and_mul(linear_forward(x, desc)), which the C forward fuses on AMX tiles."""
    _check_rows("glu_forward", x, desc)
    both = torch.empty(x.shape[0], desc.n_out, dtype=torch.bfloat16)
    y = torch.empty(x.shape[0], desc.n_out // 2, dtype=torch.bfloat16)
    if x.shape[0] and _library().glu_forward(ctypes.byref(desc), x.data_ptr(), x.stride(0), x.shape[0],
                              both.data_ptr(), y.data_ptr()):
        raise MemoryError("glu_forward could not allocate its scratch memory")
    return y


# the whole-model forward of each activation dtype
_MODEL_FORWARDS = {torch.bfloat16: "model_forward", torch.float32: "model_forward_f32"}


def model_forward_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """The whole-model forward function for `dtype` (model_forward.c, model_forward_f32.c)."""
    name = _MODEL_FORWARDS.get(dtype)
    return name is not None and _built_with(name)


def model_forward_function(dtype: torch.dtype) -> ctypes._CFuncPtr:
    """model_forward[_f32](out, residual, rows, layers, num_layers, &batch); see cpu_model.py."""
    return getattr(_library(), _MODEL_FORWARDS[dtype])
