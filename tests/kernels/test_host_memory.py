"""Host memory in 2 MiB pages (inferlab.kernels.host_memory): the KV cache (zeroed): zeros,
committed page by page as blocks are written, and returned when the cache goes; and the packed
weights' arena, which the bf16 and quantized C linears pack into."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch
from torch import nn

from inferlab.kernels import cpu_ops, host_memory
from inferlab.kernels.cpu_linear import PackedLinear
from inferlab.kernels.host_memory import commit_pages, empty_in_huge_pages, in_huge_pages, zeroed
from inferlab.quant.linear import build_quant_linear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import make_scheme

GIB = 2**30


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096  # pages resident


def test_a_cpu_cache_is_zeros_of_its_shape_and_dtype():
    cache = zeroed((5, 16, 3, 64), torch.bfloat16, "cpu")
    assert cache.shape == (5, 16, 3, 64) and cache.dtype == torch.bfloat16 and cache.is_contiguous()
    assert torch.equal(cache, torch.zeros_like(cache))
    cache[4, 15, 2, 63] = 1.5
    assert cache.view(-1)[-1] == 1.5 and cache.sum() == 1.5


def test_a_cpu_cache_holds_only_the_pages_written_and_frees_them():
    before = resident_bytes()
    cache = zeroed((GIB // 2,), torch.bfloat16, "cpu")  # 1 GiB
    assert resident_bytes() - before < GIB // 16
    cache[: GIB // 8].fill_(1)  # a quarter of it
    assert GIB // 4 - GIB // 16 < resident_bytes() - before < GIB // 4 + GIB // 16
    del cache
    gc.collect()
    assert resident_bytes() - before < GIB // 16


def _huge_page_bytes(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds address."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                inside = start <= address < end
            elif inside and fields[0] == "AnonHugePages:":
                return int(fields[1]) * 1024
    return 0


def _kernel_grants_huge_pages_on_request() -> bool:
    """Whether a private anonymous mapping that asks for huge pages gets them here (the kernel
    may have them off, or memory too fragmented to give them)."""
    memory = mmap.mmap(-1, 8 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.madvise(mmap.MADV_HUGEPAGE)
    probe = torch.frombuffer(memory, dtype=torch.uint8)
    probe.fill_(1)
    granted = _huge_page_bytes(probe.data_ptr()) > 0
    del probe
    memory.close()
    return granted


def test_a_cpu_cache_is_written_into_huge_pages():
    if not _kernel_grants_huge_pages_on_request():
        pytest.skip("this kernel gives no transparent huge pages to a mapping that asks")
    cache = zeroed((32 * 2**20,), torch.bfloat16, "cpu")  # 64 MiB
    cache.fill_(1)
    assert _huge_page_bytes(cache.data_ptr()) >= 32 * 2**20


def test_a_kernel_that_refuses_huge_pages_still_gives_a_cache(monkeypatch):
    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 0x7FFF, raising=False)  # advice no kernel knows
    cache = zeroed((4, 16, 3, 64), torch.bfloat16, "cpu")
    cache[3, 15] = 2.0
    assert cache.sum() == 2.0 * 3 * 64


def test_arena_tensors_are_copies_apart_and_aligned():
    sources = [torch.randn(n, 96).to(torch.bfloat16) for n in (1, 37, 5000)]
    copies = [in_huge_pages(t) for t in sources]
    for source, copy in zip(sources, copies, strict=True):
        assert torch.equal(copy, source) and copy.is_contiguous()
        assert copy.data_ptr() % host_memory.ALIGN_BYTES == 0
    copies[1].fill_(7)  # its neighbours keep their values
    assert torch.equal(copies[0], sources[0]) and torch.equal(copies[2], sources[2])
    assert torch.equal(empty_in_huge_pages((3, 5), torch.int32), torch.zeros(3, 5, dtype=torch.int32))


def test_a_tensor_larger_than_a_chunk_gets_its_own_and_is_freed_with_it():
    before = resident_bytes()
    big = empty_in_huge_pages((host_memory.ARENA_CHUNK_BYTES * 2,), torch.uint8)
    assert big.data_ptr() % host_memory.HUGE_PAGE_BYTES == 0
    big.fill_(1)
    assert resident_bytes() - before >= host_memory.ARENA_CHUNK_BYTES * 2 - GIB // 64
    assert int(big.sum()) == host_memory.ARENA_CHUNK_BYTES * 2
    del big
    gc.collect()
    assert resident_bytes() - before < GIB // 64


def test_the_arena_returns_its_chunks_when_their_tensors_go():
    host_memory._WEIGHTS = host_memory._Arena()
    before = resident_bytes()
    tensors = [empty_in_huge_pages((2**20,), torch.uint8) for _ in range(96)]  # 96 MiB: two chunks
    for t in tensors:
        t.fill_(1)
    assert resident_bytes() - before >= 96 * 2**20
    del tensors, t
    gc.collect()
    assert resident_bytes() - before < GIB // 64


@pytest.mark.skipif(not cpu_ops.bf16_linear_available(), reason="no AVX512-BF16 C kernels here")
def test_packed_weights_are_written_into_huge_pages():
    if not _kernel_grants_huge_pages_on_request():
        pytest.skip("this kernel gives no transparent huge pages to a mapping that asks")
    host_memory._WEIGHTS = host_memory._Arena()  # a fresh chunk: earlier tests' tensors hold none of it
    dense = nn.Linear(1536, 2048, bias=False).to(torch.bfloat16)  # 6 MiB of weights
    packed = PackedLinear(dense).packed
    assert _huge_page_bytes(packed.data_ptr()) >= 2 * host_memory.HUGE_PAGE_BYTES
    for name in ("W8A16", "W4A16", "W8A8"):  # the weight-only and the dynamic C layers
        scheme = make_scheme(name, 128, False)
        qw = quantize_rtn(torch.randn(2048, 1536), scheme.weights)
        layer = build_quant_linear(qw, scheme.activations, None, torch.bfloat16)
        if hasattr(layer, "c_desc"):
            assert _huge_page_bytes(layer.packed.data_ptr()) >= host_memory.HUGE_PAGE_BYTES, name


def test_committed_pages_are_resident_zeros():
    before = resident_bytes()
    cache = zeroed((16 * 2**20,), torch.bfloat16, "cpu")  # 32 MiB
    assert resident_bytes() - before < 2**20
    commit_pages(cache)
    assert resident_bytes() - before >= 32 * 2**20
    assert torch.equal(cache, torch.zeros_like(cache))


def test_the_engines_kv_cache_is_committed_when_built():
    """Filling every page of a committed cache adds nothing resident."""
    from inferlab.engine.llm import LLM

    llm = LLM(dtype="float32", kv_cache_memory="64MiB")
    before = resident_bytes()
    for k_cache, v_cache in llm.engine.runner.kv_caches:
        k_cache.fill_(1)
        v_cache.fill_(1)
    assert resident_bytes() - before < 4 * 2**20
