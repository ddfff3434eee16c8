"""Sizing the KV cache from --gpu-memory-utilization: the profiled step, the arithmetic, the
errors; on a GPU, the engine's cache within the share it was given."""

from __future__ import annotations

import pytest
import torch

from inferlab.config import CPU_KV_CACHE_BYTES, EngineConfig
from inferlab.engine.memory_profile import DeviceMemory, profile_query_lens, run_profile_step
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError

GIB = 2**30


@pytest.mark.parametrize(("tokens", "seqs", "max_len", "expected"), [
    (2048, 256, 8192, [8] * 256),  # the server's step: every sequence sampled
    (100, 3, 40, [34, 33, 33]),
    (100, 2, 40, [40, 40]),  # the context caps what one step can hold
    (5, 256, 8192, [1] * 5),  # no more sequences than tokens
])
def test_the_profiled_step_is_the_largest_the_scheduler_builds(tokens, seqs, max_len, expected) -> None:
    assert profile_query_lens(tokens, seqs, max_len) == expected


def test_the_kv_cache_gets_what_the_utilization_leaves() -> None:
    memory = DeviceMemory(total_bytes=100 * GIB, peak_torch_bytes=20 * GIB, non_torch_bytes=GIB)
    assert memory.kv_cache_bytes(0.9) == 69 * GIB  # 90 - 20 - 1
    with pytest.raises(InferlabError, match="no room for a KV cache.*--gpu-memory-utilization 0.2"):
        memory.kv_cache_bytes(0.2)  # 20 GiB usable < 21 taken


def test_the_utilization_is_a_share() -> None:
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(InferlabError, match="gpu_memory_utilization"):
            EngineConfig(gpu_memory_utilization=bad)


def test_the_profile_step_runs_the_model_on_a_cache_just_large_enough(smollm_fp32) -> None:
    model, cfg = smollm_fp32.model, smollm_fp32.config
    cache_bytes = run_profile_step(model, [34, 33, 33], 16, torch.float32, torch.device("cpu"))
    blocks = 9  # 3 + 3 + 3 blocks of 16 tokens
    assert cache_bytes == 2 * cfg.num_layers * blocks * 16 * cfg.num_kv_heads * cfg.head_dim * 4


def test_on_a_cpu_the_cache_defaults_to_a_fixed_size(make_llm, monkeypatch) -> None:
    # the rule, not the 2 GiB: committing that much took ~23 s of the suite on this VM
    assert CPU_KV_CACHE_BYTES == 2 * GIB
    monkeypatch.setattr("inferlab.engine.llm_engine.CPU_KV_CACHE_BYTES", 96 * 2**20)
    llm = make_llm(kv_cache_memory=None)
    engine = llm.engine
    per_block = engine.config.block_size * engine.kv_bytes_per_token
    assert llm.num_kv_blocks == 96 * 2**20 // per_block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_engine_stays_within_its_share() -> None:
    pytest.importorskip("triton")
    from inferlab.engine.llm import LLM

    total = torch.cuda.mem_get_info()[1]
    share = 0.3
    llm = LLM(device="cuda", dtype="bfloat16", gpu_memory_utilization=share, enforce_eager=True)
    used = total - torch.cuda.mem_get_info()[0]
    cache_bytes = llm.num_kv_blocks * llm.engine.config.block_size * llm.engine.kv_bytes_per_token
    assert cache_bytes > 0.5 * share * total  # a 135M model leaves most of the share to the cache
    # what this process and others held before counts against the share too; + allocator slack
    assert used <= share * total + 256 * 2**20
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4))
    assert len(out[0].outputs[0].token_ids) == 4
    with pytest.raises(InferlabError, match="no room for a KV cache"):
        LLM(device="cuda", dtype="bfloat16", gpu_memory_utilization=1e-4, enforce_eager=True)
