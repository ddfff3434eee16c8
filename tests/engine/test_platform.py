"""The CPU engine's allocator settings: freed memory kept for the next step (keep_freed_memory),
and what loading freed handed back once (release_freed_memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# In a fresh process, where a 16 MB tensor comes from: glibc's defaults map it on its own and
# unmap it when freed, so the next step's tensor faults in every page again; with the setting it
# comes from the heap, whose freed top is kept for reuse.
WHERE = """
import torch
from inferlab.engine.platform import keep_freed_memory
assert keep_freed_memory()
address = torch.ones((16 << 20) // 4).data_ptr()
for line in open("/proc/self/maps"):
    fields = line.split()
    low, high = (int(x, 16) for x in fields[0].split("-"))
    if low <= address < high:
        print(fields[5] if len(fields) > 5 else "anonymous mapping")
"""


def test_step_sized_tensors_come_from_the_heap_that_is_kept() -> None:
    run = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[heap]"


# resident MB of the process, read by the scripts below
RSS_MB = """
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
"""

RETURNED = RSS_MB + """
import torch
from inferlab.engine.platform import keep_freed_memory, release_freed_memory

assert keep_freed_memory()
blocks = [torch.ones((1 << 20) // 4) for _ in range(300)]  # 300 MB, each below the mmap threshold
del blocks
kept = rss_mb()
assert release_freed_memory()
print(kept - rss_mb())
"""


def test_freed_heap_memory_is_kept_until_released() -> None:
    """keep_freed_memory keeps what a step frees for the next; release_freed_memory, called once
    an engine has loaded, hands the load's freed memory back."""
    run = subprocess.run([sys.executable, "-c", RETURNED], capture_output=True, text=True, check=True)
    assert float(run.stdout) > 250


LOADED = RSS_MB + """
import torch
from inferlab.engine.llm import LLM

before = rss_mb()
llm = LLM(dtype="float32", kv_cache_memory="64MiB")
weights = sum(p.numel() * p.element_size() for p in llm.engine.loaded.model.parameters())
weights += sum(b.numel() * b.element_size() for b in llm.engine.loaded.model.buffers())
print(rss_mb() - before, weights / 2**20)
"""


def test_a_loaded_engine_holds_its_weights_not_the_load_s_garbage() -> None:
    """The embedded model in fp32 (0.54 GB of weights) left 1.5 GB more resident than before it
    loaded: the dequantized checkpoint and the linears' unpacked copies, freed but kept in the
    heap. Now its weights, the 64 MiB KV cache and a margin."""
    run = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, check=True)
    grown_mb, weights_mb = map(float, run.stdout.split())
    assert grown_mb < weights_mb + 64 + 250, (grown_mb, weights_mb)
