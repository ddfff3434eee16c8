"""/proc/cpuinfo's first value of a field, read once (torch-free: the planner reads it too)."""

from __future__ import annotations

import contextlib
import functools


@functools.cache
def cpuinfo_field(key: str) -> str | None:
    """The value of the first `key : value` line of /proc/cpuinfo; None where it is not there."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    return None
