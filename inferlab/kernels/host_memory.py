"""Host tensors in 2 MiB pages: the KV cache, and the packed weights the C kernels stream.

Both are read at memory speed every decode step, from scattered blocks (the cache) or front to
back (the weights). In 4 KiB pages, every 4 KiB of a stream costs a TLB miss and its page walk;
in 2 MiB pages (transparent huge pages, which Linux grants to private anonymous mappings that
ask for them) one entry covers 512 times as much. The embedded model's 121 linears from memory
ran 7-10% faster at 1 to 16 rows, 5% at 64, with their weights in 2 MiB pages (ad hoc, C, after
a 700 MB read had flushed the caches; the Intel Xeon with AMX).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import threading
import weakref

import torch

HUGE_PAGE_BYTES = 2 << 20
ARENA_CHUNK_BYTES = 64 << 20  # a chunk of the weights' arena; larger tensors get their own
ALIGN_BYTES = 4096  # where each tensor in the arena starts


def huge_page_mapping(nbytes: int) -> mmap.mmap:
    """Private anonymous memory of nbytes, zeros, committed page by page when first written,
    asked for in 2 MiB pages. (Python's default for mmap(-1), a shared mapping, gets no huge
    pages.)"""
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no such advice here (not Linux, or no THP)
        memory.madvise(mmap.MADV_HUGEPAGE)
    return memory


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
    """A zero tensor. On a CPU, over huge_page_mapping, whose pages the OS hands out zeroed
    when first written (commit_pages faults them all in at once). A first write zeroes 2 MiB at
    once instead of faulting 4 KiB by 4 KiB, and decode attention's scattered reads miss the
    TLB less (64 tokens x 300 positions, 30 layers: 31.3 -> 29.6 ms)."""
    numel = math.prod(shape)
    if torch.device(device).type != "cpu" or numel == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.frombuffer(huge_page_mapping(numel * dtype.itemsize), dtype=dtype).view(shape)


def commit_pages(t: torch.Tensor) -> None:
    """Fault in every page of a CPU tensor from zeroed now, before anything is written to it
    (it writes a zero into each 4 KiB). The KV cache's first writes otherwise fault its pages
    in during decode steps, a block at a time as the allocator walks the pool: each 2 MiB page
    took 0.2-2.4 ms here (2.4 where the VM had to back fresh memory first), ~3 ms of a 48 ms
    step of 64 tokens. Committing the default 2 GiB cache takes 0.2-4.6 s of a start; offline
    throughput went 910 -> 1040 tokens/s with it (benchmarks/offline_throughput.py)."""
    if t.device.type == "cpu" and t.numel():
        t.view(-1).view(torch.uint8)[::4096] = 0


def return_freed_memory() -> None:
    """Give the heap's free pages back to the OS (glibc's malloc_trim; nothing elsewhere). A
    load frees each layer's full-width weights once its linears narrow, but glibc keeps freed
    chunks of a few MB in its heap once its mmap threshold has grown past them, and the next
    layer's did not reuse them: the embedded model's fp32 load peaked at 0.90-1.05 GB and held
    0.70-0.86 GB after, against 0.66-0.68 GB and 0.37 GB with a trim after each layer and at the
    end (`/proc/self/status`, a /tmp script, runs alternating)."""
    with contextlib.suppress(AttributeError, OSError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


class _Arena:
    """Tensors side by side in 2 MiB-aligned chunks of huge_page_mapping: a linear's weights
    (0.6-3.5 MB in the embedded model) are too small, one mapping each, for whole 2 MiB pages.
    Each tensor holds its chunk; the arena only a weak reference to the chunk it fills, so a
    chunk is unmapped when the last tensor in it goes (a model dropped returns all of its)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunk = lambda: None  # a weak reference to the chunk being filled
        self._used = self._end = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes > ARENA_CHUNK_BYTES:  # a mapping of its own
            chunk, offset, _ = self._new_chunk(nbytes)
        else:
            with self._lock:
                chunk = self._chunk()
                if chunk is None or self._end - self._used < nbytes:
                    chunk, self._used, self._end = self._new_chunk(ARENA_CHUNK_BYTES)
                    self._chunk = weakref.ref(chunk)
                offset = self._used
                self._used += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
        return torch.frombuffer(chunk, dtype=dtype, count=count, offset=offset).view(shape)

    @staticmethod
    def _new_chunk(nbytes: int) -> tuple[mmap.mmap, int, int]:
        """A mapping with nbytes from its first 2 MiB boundary on: (mapping, start, end)."""
        memory = huge_page_mapping(nbytes + HUGE_PAGE_BYTES)
        address = torch.frombuffer(memory, dtype=torch.uint8, count=1).data_ptr()
        start = -address % HUGE_PAGE_BYTES
        return memory, start, start + nbytes


_WEIGHTS = _Arena()


def empty_in_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised CPU tensor (zeros until written) in the weights' arena."""
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype)
    return _WEIGHTS.empty(shape, dtype)


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of the CPU tensor t in the weights' arena."""
    out = empty_in_huge_pages(tuple(t.shape), t.dtype)
    out.copy_(t)
    return out
