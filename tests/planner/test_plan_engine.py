"""The engine sizes its KV pool with the planner's formula: same budget, same block count."""

from __future__ import annotations

import pytest

from inferlab.planner.budget import MemoryConfig, plan_memory
from inferlab.planner.memory import weight_bytes, weight_format
from inferlab.planner.model_shapes import resolve_model

llm_module = pytest.importorskip("inferlab.engine.llm")

KV_BUDGET_BYTES = 64 * 2**20


def test_engine_allocates_exactly_the_planned_kv_blocks():
    spec = resolve_model(None)
    planned = plan_memory(spec.config, weight_bytes(spec.config, weight_format("bf16")),
                          MemoryConfig(device_memory_bytes=2**34, kv_dtype="bf16", block_size=16,
                                       kv_cache_bytes=KV_BUDGET_BYTES))
    llm = llm_module.LLM(model=None, dtype="bfloat16", kv_cache_memory="64MiB", max_num_seqs=4)
    # 64 MiB / (16 tokens × 23,040 B) = 182.04 -> 182 whole blocks, by hand
    assert planned.num_blocks == 182
    assert llm.num_kv_blocks == planned.num_blocks
    assert llm.engine.scheduler.block_manager.num_blocks == planned.num_blocks
    # and the tensors really allocated hold exactly that many blocks of planned size
    allocated = sum(t.numel() * t.element_size() for kv in llm.engine.runner.kv_caches for t in kv)
    assert allocated == planned.num_blocks * planned.block_bytes
    assert allocated <= KV_BUDGET_BYTES
