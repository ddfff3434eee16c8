"""Start-up settings: the default dtype for the CPU at hand, and num_threads where steps run."""

from __future__ import annotations

import asyncio
import ctypes

import pytest
import torch

from inferlab.engine import platform
from inferlab.engine.async_engine import AsyncEngine
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams

FP32_BYTES_PER_TOKEN = 46080  # the embedded model's K and V in fp32: 30 layers x 3 heads x 64 x 2 x 4


@pytest.mark.parametrize(("flags", "device", "expected"), [
    ({"avx512f", "avx512_bf16"}, "cpu", torch.bfloat16),  # AVX512-BF16 (Zen 4+, Cooper Lake)
    ({"avx512f", "amx_bf16", "amx_tile"}, "cpu", torch.bfloat16),  # AMX (Sapphire Rapids)
    ({"avx2", "avx512f", "avx512_vnni"}, "cpu", torch.float32),  # no bf16 arithmetic
    (set(), "cpu", torch.float32),  # flags unknown
    (set(), "cuda", torch.bfloat16),
])
def test_auto_dtype_follows_the_cpu_flags(monkeypatch, flags, device, expected):
    monkeypatch.setattr(platform, "cpu_flags", lambda: frozenset(flags))
    assert platform.resolve_dtype("auto", torch.device(device)) == expected
    assert platform.resolve_dtype("float32", torch.device(device)) == torch.float32


def test_num_threads_reaches_the_async_engine_thread(make_llm):
    """OpenMP keeps the team size per thread, so the setting must be applied on the loop's own
    thread: there the C kernels' parallel regions ask omp_get_max_threads()."""
    before = torch.get_num_threads()
    try:
        engine = AsyncEngine(make_llm(num_threads=1).engine)
        seen: list[int] = []

        class Probe:  # observers are held weakly: a bound method of a live object
            def step(self, seconds: float, tokens: int) -> None:
                seen.append(ctypes.CDLL("libgomp.so.1").omp_get_max_threads())

        probe = Probe()
        engine.observe_steps(probe.step)

        async def run() -> None:
            [_ async for _ in engine.generate("Hello", SamplingParams(max_tokens=3), "threads")]
            await engine.shutdown(timeout_s=10)

        asyncio.run(run())
        assert seen and set(seen) == {1}
    finally:
        torch.set_num_threads(before)


def test_a_context_longer_than_the_models_is_refused(make_llm):
    """As vLLM refuses it: the embedded model has 8192 positions."""
    from inferlab.errors import InferlabError

    with pytest.raises(InferlabError, match="max_model_len 8193 is over the model's 8192 positions"):
        make_llm(max_model_len=8193)
    whole = 8192 * FP32_BYTES_PER_TOKEN  # a KV cache of exactly 8192 tokens
    assert make_llm(max_model_len=8192, kv_cache_memory=whole).engine.max_model_len == 8192


def test_a_context_the_kv_cache_cannot_hold_is_refused_or_lowered(make_llm):
    """4 blocks of 16 tokens hold 64: an asked max_model_len of 65 is refused at start, as
    vLLM refuses it; unasked, the model's 8192 is lowered to 64 (it once stayed 8192, and a
    chat request without max_tokens was refused for want of blocks)."""
    from inferlab.errors import InferlabError

    cache = 4 * 16 * FP32_BYTES_PER_TOKEN
    with pytest.raises(InferlabError, match=r"max_model_len 65 does not fit in the KV cache: "
                                            r"2\.81 MiB holds 64 tokens"):
        make_llm(max_model_len=65, kv_cache_memory=cache)
    assert make_llm(max_model_len=64, kv_cache_memory=cache).engine.max_model_len == 64
    llm = make_llm(kv_cache_memory=cache)
    assert llm.engine.max_model_len == 64
    out = llm.generate(["Hi"], SamplingParams(max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 64 - len(llm.engine.tokenize_prompt("Hi")[1])


def test_a_model_loaded_for_another_dtype_is_refused(smollm_fp32):
    """An engine given an fp32 model while it runs bf16 once took it: bf16 activations and KV
    cache beside fp32 weights, its tokens silently off those of either dtype."""
    from inferlab.errors import InferlabError

    with pytest.raises(InferlabError, match="^the model was loaded as float32 on cpu; this engine runs "
                                            "bfloat16 on cpu$"):
        LLM(loaded=smollm_fp32, dtype="bfloat16", kv_cache_memory="64MiB")
