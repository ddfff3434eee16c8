"""The KV cache's memory on a CPU (model_runner.zeroed): zeros, committed page by page as
blocks are written, and returned when the cache goes."""

from __future__ import annotations

import gc

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
