"""One Triton kernel, two ways to run it: compiled for CUDA tensors, interpreted for CPU tensors.

`triton.jit` decides between compiling and interpreting once, at import time, from the
TRITON_INTERPRET environment variable. That would make the CPU tests depend on which module
happened to import a kernel first, so each kernel here keeps both forms and picks one from the
device of its inputs: the same kernel source runs on the GPU and, through the interpreter, in
the CPU test suite.

Kernels call triton.language helpers (tl.max, tl.sum, tl.cdiv...) that are themselves jitted
functions, compiled-mode unless TRITON_INTERPRET was set at import; an interpreted launch
therefore swaps interpreted twins of those helpers into `triton.language` for its duration.
(So do not compile CUDA kernels in another thread while a CPU launch runs.)

The interpreter stores bfloat16 as raw uint16 and does arithmetic on those bits, so kernels
upcast to float32 before any arithmetic, and `dot_dtype` says which dtype tl.dot may be fed.
It also truncates fp32 -> bf16 casts where a GPU rounds to nearest: bf16 results from the
interpreter can be one or two ulps off torch's, fp16 and fp32 ones are exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

# Public jitted helpers of triton.language, as interpreted twins (empty under TRITON_INTERPRET=1,
# where they are interpreted already). Private combine functions stay as they are: the
# interpreter recognises them by identity to reduce with numpy.
_INTERPRETED_HELPERS = {name: InterpretedFunction(obj.fn) for name, obj in vars(tl).items()
                        if isinstance(obj, JITFunction) and not name.startswith("_")}

# What the interpreter patches while it runs a kernel. It restores what a launch patched, but
# not what a helper called from inside the kernel patched (triton.language.core's functions,
# such as `add`), and a later compile for CUDA then runs those interpreter versions and fails.
_LANGUAGE_NAMESPACES = (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype,
                        tl.core.tensor_descriptor_base)


@contextmanager
def _helpers_interpreted() -> Iterator[None]:
    saved = [(ns, dict(vars(ns))) for ns in _LANGUAGE_NAMESPACES]
    for name, fn in _INTERPRETED_HELPERS.items():
        setattr(tl, name, fn)
    try:
        yield
    finally:
        for ns, before in saved:
            for name in set(vars(ns)) - set(before):
                delattr(ns, name)
            for name, value in before.items():
                if vars(ns).get(name) is not value:
                    setattr(ns, name, value)


class _InterpretedLauncher:
    """`launcher[grid](*args)` runs the kernel in the interpreter with interpreted helpers."""

    def __init__(self, fn: InterpretedFunction) -> None:
        self.fn = fn

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            with _helpers_interpreted():
                self.fn[grid](*args, **kwargs)
        return launch


class DualKernel:
    """A Triton kernel source kept both compiled (CUDA) and interpreted (CPU)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.compiled = triton.jit(fn)
        self.interpreted = InterpretedFunction(fn)
        self.__name__ = fn.__name__

    def on(self, device: torch.device) -> Any:
        """The launchable form for tensors on `device` (use as `kernel.on(dev)[grid](...)`)."""
        return self.compiled if device.type == "cuda" else _InterpretedLauncher(self.interpreted)


def dual_jit(fn: Callable[..., Any]) -> DualKernel:
    """Decorator: like triton.jit, but runnable on CPU tensors through the interpreter."""
    return DualKernel(fn)


def dot_dtype(dtype: torch.dtype, device: torch.device) -> tl.dtype:
    """The dtype tl.dot operands are cast to: the input dtype, except bf16 in the interpreter."""
    if dtype == torch.bfloat16:
        return tl.bfloat16 if device.type == "cuda" else tl.float32
    return {torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products (a GPU would use tf32 by default); this is the
    path for checking against references, not for speed. 16-bit inputs ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_device(*tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, CUDA or CPU (the interpreter); returns that device."""
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"tensors on different devices: {t.device} and {device}")
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"Triton kernels run on cuda or (interpreted) cpu, not {device.type}")
    return device
