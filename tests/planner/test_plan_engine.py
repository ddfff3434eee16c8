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


def test_planned_weights_on_cpu_local_are_what_the_engine_holds(capsys, tmp_path):
    """The checkpoint's weights, each once: the engine's bf16 CPU kernels pack the tied lm_head,
    and the embedding lookups read that copy (a second one, 56,623,104 B, was held before)."""
    import json

    import torch

    from inferlab.cli import main
    from inferlab.engine.platform import cpu_has_fast_bf16
    from inferlab.kernels.cpu_linear import packed_linear_supported
    from inferlab.planner.measure import cpu_name
    from tests.planner.test_plan_cli import FIGURES

    if not (cpu_has_fast_bf16() and packed_linear_supported(torch.device("cpu"), torch.bfloat16)):
        pytest.skip("the packed bf16 CPU kernels do not run here")
    cache = tmp_path / "cpu.json"
    cache.write_text(json.dumps(FIGURES | {"cpu": cpu_name()}))
    assert main(["plan", "--cache", str(cache), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["memory"]["weight_bytes"]
    model = llm_module.LLM(model=None, dtype="bfloat16", kv_cache_memory="64MiB").engine.loaded.model
    tensors = [*model.named_parameters(), *model.named_buffers()]
    held = {t.data_ptr(): t.numel() * t.element_size() for name, t in tensors
            if not name.startswith("model.rotary.")}  # the RoPE tables: not weights
    assert planned == sum(held.values()) == 269_030_016
