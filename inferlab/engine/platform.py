"""Which device and dtype to run on, decided once at start-up."""

from __future__ import annotations

import functools

import torch

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 matmuls run faster than fp32 here."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def available_memory_bytes(device: torch.device) -> int | None:
    """What a new allocation can still take: free device memory on CUDA, MemAvailable on Linux
    hosts; None where it is unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            lines = [line for line in f if line.startswith("MemAvailable:")]
        return int(lines[0].split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # no /proc (not Linux) or no such line
        return None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return _TORCH_DTYPES[dtype]
    if device.type == "cuda" or cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32
