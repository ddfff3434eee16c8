"""The Triton kernels compile for the H200 (sm_90) with the launch settings their wrappers pick.

No GPU is needed: each wrapper runs as if its tensors were on CUDA, with the launch intercepted
(kernel, arguments, constexprs, num_warps recorded); the recorded launch is then compiled by
Triton for sm_90 down to a cubin, specialised the way Triton's launcher would (ints equal to 1
as constants, 16-divisible ints and pointers marked so). Checked: it compiles; no register
spills (cuobjdump reports no stack frame); tensor-core instructions where the tile allows them
(wgmma for 64-row tiles on Hopper, mma for 16-row ones).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from inferlab.kernels import triton_cache_ops, triton_norm_rope, triton_w4a16  # noqa: E402
from inferlab.kernels.attention import triton_paged  # noqa: E402
from inferlab.kernels.attention.metadata import AttentionMetadata  # noqa: E402
from inferlab.kernels.triton_common import DualKernel  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
         torch.int32: "i32", torch.int64: "i64"}
KERNEL_MODULES = (triton_cache_ops, triton_norm_rope, triton_w4a16, triton_paged)

pytestmark = pytest.mark.skipif(not os.path.isfile(CUOBJDUMP),
                                reason="Triton's CUDA backend tools are not installed")


@dataclass
class Launch:
    kernel: DualKernel
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[Launch]:
    """Wrappers believe their CPU tensors are on CUDA; their launches are recorded, not run."""
    recorded: list[Launch] = []

    class Recorder:
        def __init__(self, kernel: DualKernel) -> None:
            self.kernel = kernel

        def __getitem__(self, grid: tuple[int, ...]):
            return lambda *args, **kwargs: recorded.append(Launch(self.kernel, args, kwargs))

    monkeypatch.setattr(DualKernel, "on", lambda self, device: Recorder(self))
    for module in KERNEL_MODULES:
        monkeypatch.setattr(module, "check_device", lambda *tensors: torch.device("cuda"))
    return recorded


def compile_sm90(launch: Launch) -> dict[str, Any]:
    """Compile one recorded launch for sm_90; returns registers, stack bytes and the PTX."""
    fn = launch.kernel.compiled
    kwargs = dict(launch.kwargs)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    options["enable_fp_fusion"] = True  # what Triton defaults to; named so it does not warn
    values = dict(zip(fn.arg_names, launch.args, strict=False)) | kwargs
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        value = values[name]
        if isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch allocations are 256-byte aligned
        elif name in kwargs or value == 1:
            signature[name], constexprs[(i,)] = "constexpr", value
        elif isinstance(value, int):
            signature[name] = "i32" if abs(value) < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], check=True,
                               capture_output=True, text=True).stdout
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack_bytes": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "ptx": compiled.asm["ptx"]}


def attention(query_lens: list[int], context_lens: list[int], hq: int, hkv: int, d: int,
              dtype: torch.dtype, splits: int | None = None) -> None:
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    meta = AttentionMetadata.build(query_lens, seq_lens, [list(range(64))] * len(seq_lens), 16)
    n = sum(query_lens)
    cache = torch.zeros(128, 16, hkv, d, dtype=dtype)
    triton_paged.paged_attention(torch.zeros(n, hq, d, dtype=dtype),
                                 torch.zeros(n, hkv, d, dtype=dtype),
                                 torch.zeros(n, hkv, d, dtype=dtype), cache, cache.clone(), meta,
                                 d ** -0.5, num_kv_splits=splits)


@pytest.mark.parametrize(("case", "tensor_cores"), [
    ("llama8b-decode", "mma"),  # 16-row tiles: one query x the GQA group of 4
    ("llama8b-mixed", "wgmma"),  # prefill chunks: 64-row tiles
    ("smollm-mixed", "wgmma"),  # GQA 3 (padded to 4), head dim 64
    ("fp32-mixed", None),  # the exact reference path
])
def test_paged_attention_compiles_without_spills(launches: list[Launch], case: str,
                                                 tensor_cores: str | None) -> None:
    shapes = {"llama8b-decode": ([1] * 4, [100] * 4, 32, 8, 128, torch.bfloat16, 4),
              "llama8b-mixed": ([1, 50], [100, 0], 32, 8, 128, torch.bfloat16, None),
              "smollm-mixed": ([1, 50], [100, 0], 9, 3, 64, torch.bfloat16, None),
              "fp32-mixed": ([1, 50], [100, 0], 4, 4, 64, torch.float32, None)}[case]
    attention(*shapes)
    cache_write, attend = launches
    assert compile_sm90(cache_write)["stack_bytes"] == 0
    result = compile_sm90(attend)
    assert result["stack_bytes"] == 0, f"{result['registers']} registers and spills"
    if tensor_cores:
        assert re.search(rf"\b{tensor_cores}\b", result["ptx"]), f"no {tensor_cores} in the PTX"


@pytest.mark.parametrize(("m", "tensor_cores"), [(1, "mma"), (300, "wgmma")])
def test_w4a16_compiles_without_spills(launches: list[Launch], m: int, tensor_cores: str) -> None:
    triton_w4a16.w4a16_linear(torch.zeros(m, 4096, dtype=torch.bfloat16),
                              torch.zeros(1024, 512, dtype=torch.int32),
                              torch.zeros(1024, 32, dtype=torch.bfloat16), 128,
                              split_k=4 if m == 1 else None)
    (launch,) = launches
    result = compile_sm90(launch)
    assert result["stack_bytes"] == 0, f"{result['registers']} registers and spills"
    assert re.search(rf"\b{tensor_cores}\b", result["ptx"])


def test_norm_and_rope_compile_without_spills(launches: list[Launch]) -> None:
    x = torch.zeros(4, 4096, dtype=torch.bfloat16)
    triton_norm_rope.rms_norm(x, torch.zeros(4096, dtype=torch.bfloat16), 1e-5, residual=x)
    triton_norm_rope.rotary_embedding(torch.zeros(4, dtype=torch.int64),
                                      torch.zeros(4, 32, 128, dtype=torch.bfloat16),
                                      torch.zeros(4, 8, 128, dtype=torch.bfloat16),
                                      torch.zeros(64, 128), torch.zeros(64, 128))
    assert len(launches) == 3  # norm, rope on q, rope on k
    for launch in launches:
        assert compile_sm90(launch)["stack_bytes"] == 0
