"""The KV cache's memory on a CPU (model_runner.zeroed): zeros, committed page by page as
blocks are written, and returned when the cache goes."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from inferlab.engine.model_runner import zeroed

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
