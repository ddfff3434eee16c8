"""Which device and dtype to run on, decided once at start-up."""

from __future__ import annotations

import ctypes
import logging

import torch

from inferlab.engine.cpuinfo import cpuinfo_field
from inferlab.errors import InferlabError

logger = logging.getLogger("inferlab.engine")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_flags() -> frozenset[str]:
    return frozenset((cpuinfo_field("flags") or "").split())


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


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_MMAP_THRESHOLD_BYTES = 32 << 20  # the largest glibc accepts
_TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory (up to 1 GiB at the heap's top) for the next step's
    tensors, rather than hand it back to the kernel and fault it in again page by page. A CPU
    decode step allocates the same activations and logits (12.6 MB of fp32 at 64 sequences)
    every time. With glibc's adaptive defaults, 64 sequences of 300-token prompts often faulted
    in 4,800-8,000 pages a decode step, and the kernel's share of the step (exc_page_fault,
    clear_page under the GEMM's stores) was 6.6% in perf; with this, 0 faults and 0.8%.
    Returns False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))


def release_freed_memory() -> bool:
    """Hand the heap's free memory back to the kernel once (malloc_trim): what loading freed (the
    checkpoint's tensors, the layouts the kernels repacked) would otherwise stay, up to
    keep_freed_memory's threshold. The embedded model in fp32 held 1.72 GB after loading, 0.85 GB
    trimmed (its weights 0.54 GB, the libraries 0.23 GB). Returns False where the C library is
    not glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise InferlabError("device cuda: torch sees no CUDA GPU here (a CPU build of torch, "
                            "or no GPU visible)")
    return torch.device(device)


def cpu_has_fast_fp16() -> bool:
    """AVX512-FP16 or AMX-FP16: torch's fp16 matmuls are native here."""
    return bool(cpu_flags() & {"avx512_fp16", "amx_fp16"})


# half-precision dtypes on the CPU: what says the CPU computes them natively
_NATIVE_ON_CPU = {"bfloat16": ("AMX or AVX512-BF16", cpu_has_fast_bf16),
                  "float16": ("AVX512-FP16 or AMX-FP16", cpu_has_fast_fp16)}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        needs, native = _NATIVE_ON_CPU.get(dtype, ("", lambda: True))
        if device.type == "cpu" and not native():
            # an AMD EPYC Zen 3: a 256x576 @ 576x1536 product 6.4x (bf16) and 4.9x (fp16) the
            # time of fp32, a 2048^3 one 480x (bf16)
            logger.warning("--dtype %s on a CPU without %s: torch emulates its matmuls here, 5x to "
                           "several hundred times slower than float32, and inferlab's half-precision "
                           "kernels do not build; --dtype auto runs float32", dtype, needs)
        return _TORCH_DTYPES[dtype]
    if device.type == "cuda" or cpu_has_fast_bf16():
        return torch.bfloat16
    return torch.float32
