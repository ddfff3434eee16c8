"""The CPU engine's allocator setting (keep_freed_memory)."""

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
