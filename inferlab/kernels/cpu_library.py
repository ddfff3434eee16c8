"""Building and loading the C kernels of inferlab/kernels/cpu/: compiled at first use with the
machine's C compiler (`cc`, 30-60 s on 2 cores) into ~/.cache/inferlab (or $INFERLAB_CACHE_DIR), keyed
by the sources' hash and the kind of CPU, and loaded through ctypes with every function's
signature. Linked against the libgomp torch already loaded, so both share one OpenMP thread pool.
gnu11, not c11: ISO mode turns off the contraction of a*b+c into FMA instructions.
INFERLAB_CPU_KERNELS=0 leaves the library unloaded (callers keep their torch path).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: building and loading the library needs no torch
    import torch

logger = logging.getLogger("inferlab.kernels")

_DIR = Path(__file__).with_name("cpu")
SOURCES = tuple(_DIR / name for name in ("ops.c", "decode_attention.c", "decode_prefix.c", "matmul.c",
                                         "amx_gemm.c", "vnni_gemm.c", "quant_linear.c", "quant_tiles.c", "avx2_quant_linear.c", "avx2_dynamic_linear.c", "dynamic_linear.c",
                                         "prefill_attention.c", "decode_amx.c", "model_forward.c", "model_forward_f32.c",
                                         "sampling.c", "block_codes.c"))
HEADERS = (_DIR / "kernels.h", _DIR / "decode_tiles.h", _DIR / "attention_tiles.h", _DIR / "quant_linear.h")

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "rms_norm": (None, [_P, _I64, _P, _P, _P, _I64, _I64, _F32, _I32]),
    "rotary": (None, [_P, _I64, _I64, _P, _P, _P, _I64, _I64, _I32]),
    "write_kv": (None, [_P, _I64, _P, _I64, _P, _P, _P, _I64, _I64, _I32]),
    "paged_decode_attention": (ctypes.c_int, [_P, _I64, _P, _P, _P, _I64, _P, _P, _P, _I64, _P,
                                              _I64, _I64, _I64, _I64, _F32, _I32]),
    "paged_prefill_attention": (ctypes.c_int, [_P, _I64, _P, _P, _P, _I64, _P, _P, _P, _I64, _P,
                                               _I64, _I64, _I64, _I64, _F32]),
    "prefill_attention_fits": (ctypes.c_int, [_I64]),
    "silu_and_mul": (None, [_P, _P, _I64, _I64, _I32]),
    "argmax_rows": (None, [_P, _I64, _I64, _I64, _P]),
    "sample_rows": (ctypes.c_int, [_P, _I64, _I64, _I64, _P, _P, _P, _P]),
    "has_bf16_linear": (ctypes.c_int, []),
    "has_quant_linear": (ctypes.c_int, []),
    "has_avx2_quant_linear": (ctypes.c_int, []),
    "has_dynamic_linear": (ctypes.c_int, []),
    "has_model_forward": (ctypes.c_int, []),
    "has_model_forward_f32": (ctypes.c_int, []),
    "release_openmp_threads": (ctypes.c_int, []),
    "block_codes_4bit": (_I64, [_P, _I64, _P, _P, _P]),
    "block_codes_8bit": (_I64, [_P, _I64, _P, _P]),
}
_BF16_LINEAR_SIGNATURES = {
    "pack_bf16_vnni": (None, [_P, _P, _I64, _I64]),
    "bf16_linear": (ctypes.c_int, [_P, _I64, _I64, _P, _P, _P, ctypes.c_int, _I64, _I64]),
}
_QUANT_LINEAR_SIGNATURES = {"linear_forward": (ctypes.c_int, [_P, _P, _I64, _I64, _P]),
                            "glu_forward": (ctypes.c_int, [_P, _P, _I64, _I64, _P, _P])}
_AVX2_QUANT_LINEAR_SIGNATURES = {"avx2_quant_linear": (ctypes.c_int, [_P, _P, _I64, _I64, _P]),
                                 "avx2_quant_dequantize": (None, [_P, _P]),
                                 "avx2_quant_rows": (None, [_P, _P, _I64, _P])}
_MODEL_FORWARD_SIGNATURES = {"model_forward": (ctypes.c_int, [_P, _P, _I64, _P, _I64, _P])}
_MODEL_FORWARD_F32_SIGNATURES = {"model_forward_f32": (ctypes.c_int, [_P, _P, _I64, _P, _I64, _P])}
LINEAR_BF16, LINEAR_INT8, LINEAR_INT4, LINEAR_W8A8, LINEAR_FP8 = range(5)  # linear_t.kind (kernels.h)


class LinearDesc(ctypes.Structure):
    """kernels.h's linear_t: one linear layer of any weight format, for linear_forward."""

    _fields_ = [*((name, _I64) for name in ("kind", "n_out", "k_in", "group")),
                *((name, _P) for name in ("weight", "scale", "group_scale", "group_zero", "bias",
                                          "weight_sums", "input_scale"))]


class Avx2QuantDesc(ctypes.Structure):
    """kernels.h's avx2_qlinear_t: a dense fp32, W8A16, W4A16, W8A8 or FP8 layer in its layout."""

    _fields_ = [*((name, _I64) for name in ("n_out", "k_in", "group", "bits")),
                *((name, _P) for name in ("codes", "scale", "offset", "bias")),
                ("act_bits", _I64), ("input_scale", _P), ("fp8", _I64), ("dense_order", _I64)]


def tensor_ptr(t: torch.Tensor | None) -> int | None:
    """For LinearDesc and the other C structs: a buffer's address, or NULL for an absent one."""
    return None if t is None else t.data_ptr()


def cache_dir() -> Path:
    """Where built kernels (and the tests' converted references) are kept across runs."""
    return Path(os.environ.get("INFERLAB_CACHE_DIR") or Path.home() / ".cache" / "inferlab")


def _cpu_features() -> bytes:
    """The CPU's model and feature flags: -march=native code built on one CPU can fault on
    another (AMX tiles on an AMD EPYC), so a cached build is only reused on the same kind."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine.encode()
    wanted = [line for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(wanted)).encode()


def _build(sources: tuple[Path, ...]) -> Path:
    """Compile `sources` into one library unless one built from the same bytes for the same
    kind of CPU exists."""
    text = b"".join(s.read_bytes() for s in (*sources, *HEADERS))
    digest = hashlib.sha256(text + b"-march=native" + _cpu_features()).hexdigest()[:16]
    target = cache_dir() / f"cpu_ops-{digest}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if sys.stderr.isatty():  # a person waits: say why (logs and captured output stay clean)
        print(f"compiling inferlab's CPU kernels for this kind of CPU into {target.parent} "
              "(once; 30-60 s on 2 cores)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        cmd = [os.environ.get("CC", "cc"), "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC",
               "-std=gnu11", "-o", str(built), *map(str, sources), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        os.replace(built, target)  # atomic: concurrent builders never load a half-written file
    return target


@functools.cache
def library() -> ctypes.CDLL | None:
    if os.environ.get("INFERLAB_CPU_KERNELS", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(_build(SOURCES)))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        logger.warning("CPU kernels unavailable, using the torch path: %s", detail.strip()[:300])
        return None
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    optional = [(lib.has_bf16_linear(), _BF16_LINEAR_SIGNATURES),
                (lib.has_quant_linear(), _QUANT_LINEAR_SIGNATURES),
                (lib.has_avx2_quant_linear(), _AVX2_QUANT_LINEAR_SIGNATURES),
                (lib.has_model_forward(), _MODEL_FORWARD_SIGNATURES),
                (lib.has_model_forward_f32(), _MODEL_FORWARD_F32_SIGNATURES)]
    for present, signatures in optional:
        for name, (restype, argtypes) in signatures.items() if present else ():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    return lib
