"""Which dtype the engine runs (resolve_dtype), and the warning where an explicit bf16 would run
on torch's emulation."""

from __future__ import annotations

import logging

import pytest
import torch

from inferlab.engine import platform

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(("fast_bf16", "auto"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_is_bf16_only_where_the_cpu_computes_it(monkeypatch, fast_bf16, auto) -> None:
    monkeypatch.setattr(platform, "cpu_has_fast_bf16", lambda: fast_bf16)
    assert platform.resolve_dtype("auto", CPU) == auto
    assert platform.resolve_dtype("auto", CUDA) == torch.bfloat16


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_explicit_half_precision_on_a_cpu_without_it_warns_and_is_kept(monkeypatch, caplog, dtype) -> None:
    monkeypatch.setattr(platform, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    with caplog.at_level(logging.WARNING, logger="inferlab.engine"):
        assert platform.resolve_dtype(dtype, CPU) == getattr(torch, dtype)
    message = caplog.records[0].getMessage()
    assert len(caplog.records) == 1 and dtype in message and "--dtype auto runs float32" in message


@pytest.mark.parametrize(("dtype", "device", "flags"), [("bfloat16", CPU, {"avx512_bf16"}), ("bfloat16", CPU, {"amx_bf16"}),
                                                        ("float16", CPU, {"avx512_fp16"}), ("bfloat16", CUDA, set()),
                                                        ("float32", CPU, set())])
def test_no_warning_where_the_dtype_runs_natively(monkeypatch, caplog, dtype, device, flags) -> None:
    monkeypatch.setattr(platform, "cpu_flags", lambda: frozenset(flags))
    with caplog.at_level(logging.WARNING, logger="inferlab.engine"):
        assert platform.resolve_dtype(dtype, device) == getattr(torch, dtype)
    assert caplog.records == []
