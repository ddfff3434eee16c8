"""Roofline and capacity on a round-number accelerator, checked against hand arithmetic."""

from __future__ import annotations

import dataclasses
import math

import pytest

from inferlab.errors import InferlabError
from inferlab.planner.budget import MemoryConfig
from inferlab.planner.capacity import SLO, Workload, plan_capacity, replica_point
from inferlab.planner.hardware import Hardware
from inferlab.planner.memory import weight_format
from inferlab.planner.model_shapes import resolve_model
from inferlab.planner.plan import PlanInputs, build_plan
from inferlab.planner.report_text import render_text
from inferlab.planner.roofline import crossover_batch, decode_step, prefill

# 1 TB/s, 1 PFLOP/s, reached in full: times are bytes / 1e12 and FLOPs / 1e15
ROUND = Hardware("round", 80 * 10**9, 1e12, {"bf16": 1e15}, 1e11, "test figures",
                 runtime_overhead_bytes=0, bandwidth_efficiency=1.0, compute_efficiency=1.0)


def _plan(model: str | None, hw: Hardware = ROUND, tp: int = 1, fmt: str = "bf16",
          step_tokens: int = 2048, **kw):
    memory = MemoryConfig(hw.memory_bytes, tensor_parallel=tp, kv_dtype="bf16",
                          runtime_overhead_bytes=hw.runtime_overhead_bytes,
                          max_num_seqs=min(256, step_tokens), max_num_batched_tokens=step_tokens)
    return build_plan(PlanInputs(resolve_model(model), hw, weight_format(fmt), memory,
                                 kw.pop("workload", Workload()), kw.pop("slo", SLO()), **kw))


def test_decode_step_llama2_7b_hand_count():
    # bytes: 13,476,831,232 weights − 262,144,000 untied embedding table (only rows are read)
    #        + 1,024 KV entries × 524,288 = 13,751,558,144 -> 13.7516 ms at 1 TB/s
    # FLOPs: 2 × (6,476,005,376 + 131,072,000 lm_head) + 1,023 × 4 × 32 × 128 × 32 = 13,750,501,376
    step = decode_step(_plan("Llama-2-7B").cost, ROUND, batch=1, context_len=1023)
    assert step.bytes_moved == 13_751_558_144
    assert step.flops == 13_750_501_376
    assert step.bound == "memory"
    assert step.time_s == pytest.approx(13.751558144e-3)


def test_the_kv_cache_at_its_own_rate_hand_count():
    """Weights held as GGUF codes stream slower than the cache's plain reads (cpu-local's two
    grids): the step of test_decode_step_llama2_7b_hand_count with weights at 0.5 TB/s and the
    KV cache at 2 TB/s: 13,214,687,232 B / 0.5e12 + 1,024 × 524,288 B / 2e12 = 26.6982 ms."""
    hw = dataclasses.replace(ROUND, stream_rates={1: {4096: 5e11}}, kv_stream_rates={1: {4096: 2e12}})
    step = decode_step(_plan("Llama-2-7B").cost, hw, batch=1, context_len=1023)
    assert (step.bytes_moved, step.kv_bytes) == (13_751_558_144, 536_870_912)
    assert step.time_s == pytest.approx(13_214_687_232 / 5e11 + 536_870_912 / 2e12)


def test_prefill_llama2_7b_hand_count():
    # FLOPs: 4,000 × 2 × 6,476,005,376 block linears + 2 × 131,072,000 lm_head once (logits for
    # the last token only) + 524,288 × (4,000 × 4,001 / 2) = 56,003,657,728,000
    step = prefill(_plan("Llama-2-7B").cost, ROUND, prompt_len=4000)
    assert step.flops == 56_003_657_728_000
    assert step.bound == "compute"
    assert step.time_s == pytest.approx(56.003657728e-3)


def test_prefill_in_chunks_of_the_step_budget_hand_count():
    # 1,024 tokens in steps of 16: 64 steps, each reading the weights (13,214,687,232 B) again,
    # writing its K/V and reading the 16 × (0 + 1 + … + 63) = 32,256 tokens' K/V written before:
    # 64 × 13,214,687,232 + (1,024 + 32,256) × 524,288 = 863,188,287,488 B -> 863.19 ms at 1 TB/s;
    # FLOPs as in one step: 1,024 × 12,952,010,752 + 262,144,000 + 524,288 × 1,024 × 1,025 / 2
    step = prefill(_plan("Llama-2-7B").cost, ROUND, prompt_len=1024, step_tokens=16)
    assert step.steps == 64
    assert step.bytes_moved == 863_188_287_488
    assert step.flops == 13_538_267_496_448
    assert step.time_s == pytest.approx(0.863188287488)


def test_tensor_parallel_past_the_kv_heads_reads_and_computes_the_copied_k_v_heads():
    """Once every weight byte and linear FLOP was divided by tp: at tp 16 a Llama-3.1-8B device
    holds one of the 8 KV heads whole, and computes its K and V."""
    cost = _plan("Llama-3.1-8B", tp=16).cost
    # bytes: (16,060,522,496 weights + 536,870,912 k/v projections again (a second copy of each
    # head) − 1,050,673,152 untied embedding table) / 16 = 971,670,016
    assert cost.weight_bytes_per_step == 971_670_016
    # FLOPs: 2 × (6,979,321,856 block linears + 268,435,456 k/v params again) / 16 = 905,969,664
    assert cost.linear_flops_per_token == 905_969_664


# ROUND with an fp8 rate twice bf16's, reached at half: times are FLOPs / (peak × 0.5)
ROUND_FP8 = dataclasses.replace(ROUND, peak_flops={"bf16": 1e15, "fp8": 2e15}, compute_efficiency=0.5)


def test_fp8_prefill_runs_lm_head_and_attention_at_the_bf16_rate():
    """Once all FLOPs of a W8A8 model were costed at the fp8 rate, though lm_head stays bf16
    (not quantized) and attention runs in bf16."""
    step = prefill(_plan("Llama-3.1-8B", hw=ROUND_FP8, fmt="fp8").cost, ROUND_FP8, prompt_len=4000)
    # block linears: 4,000 × 2 × 6,979,321,856 = 55,834,574,848,000 FLOPs at fp8 -> 55.834… ms
    # lm_head 2 × 128,256 × 4,096 = 1,050,673,152 + attention 4 × 32 × 128 × 32 × 4,000 × 4,001 / 2
    # = 4,195,352,576,000: 4,196,403,249,152 FLOPs at bf16 -> 8.392… ms; 64.227381346304 ms in all
    assert step.bound == "compute"
    assert step.compute_s == pytest.approx(55.834574848e-3 + 8.392806498304e-3)
    assert (step.linear_flops, step.dense_flops) == (55_834_574_848_000, 4_196_403_249_152)
    assert (step.flops_dtype, step.dense_flops_dtype) == ("fp8", "bf16")
    assert "compute-bound: 55.8 TFLOP / (2 PFLOP/s × 0.5) + 4.2 TFLOP / (1 PFLOP/s × 0.5)" in render_text(
        _plan("Llama-3.1-8B", hw=ROUND_FP8, fmt="fp8", step_tokens=4096, workload=Workload(4000, 1)))


def test_fp8_decode_turns_compute_bound_at_the_split_rates():
    # one more sequence at context 0 adds 2 × 6,979,321,856 FLOPs at fp8 (13.958643712 µs) and
    # 1,050,673,152 lm_head FLOPs at bf16 (2.101346304 µs) against 131,072 B of K/V (0.131072 µs):
    # the weight read (9,083,953,152 B − 1,050,673,152 B of untied embedding table: 8.03328 ms)
    # is paid off past 8.03328 ms / (13.958643712 + 2.101346304 − 0.131072) µs ≈ 504.3 sequences
    # (before, lm_head at the fp8 rate: ≈ 539.9)
    cost = _plan("Llama-3.1-8B", hw=ROUND_FP8, fmt="fp8").cost
    assert cost.weight_bytes_per_step == 8_033_280_000
    assert crossover_batch(cost, ROUND_FP8, 0) == pytest.approx(
        8.03328e-3 / ((13.958643712 + 2.101346304 - 0.131072) * 1e-6))


def test_max_num_batched_tokens_caps_the_batch_and_the_rate():
    """Once planned at batch 256 and one-step prefill whatever the step budget (the engine
    now requires max_num_seqs <= the budget: _plan sets both to 16)."""
    plan = _plan("Llama-2-7B", step_tokens=16, workload=Workload(1024, 2))
    # steps of 16 tokens keep not even one such request up (16 × 2 / 1,026 < 1): batch 1
    assert plan.max_batch == 1 and plan.capacity.limited_by == "max_num_batched_tokens"
    assert plan.prefill.steps == 64
    point = replica_point(plan.cost, ROUND, Workload(1024, 2), 1, 1, step_tokens=16)
    # each request needs its 1,026 tokens of 16-token steps; a batch-1 decode step reads
    # 13,214,687,232 B of weights + 1,026 × 524,288 B of K/V = 13.75260672 ms:
    # 16 / (1,026 × 13.75260672 ms)
    assert point.requests_per_s == pytest.approx(1.1339335318629242)


def test_ttft_at_batch_1_is_the_chunked_prefill_and_the_slo_checks_it():
    """Once TTFT at batch 1 added 64 decode steps to the prefill (893.92 ms), reading the
    weights twice a step though nothing else decodes, so the headline TTFT and the SLO disagreed."""
    plan = _plan("Llama-2-7B", step_tokens=16, workload=Workload(1024, 2))
    point = replica_point(plan.cost, ROUND, Workload(1024, 2), 1, 1, step_tokens=16)
    # the 64 chunks of 16 alone, as test_prefill_in_chunks_of_the_step_budget_hand_count: 863.19 ms
    assert point.ttft_ms == pytest.approx(863.188287488)
    assert plan.prefill.time_s * 1e3 == pytest.approx(863.188287488)
    met = _plan("Llama-2-7B", step_tokens=16, workload=Workload(1024, 2), slo=SLO(ttft_ms=864))
    assert met.capacity.best.ttft_ms <= 864
    with pytest.raises(InferlabError, match="ttft_ms is 863.2 > 862"):
        _plan("Llama-2-7B", step_tokens=16, workload=Workload(1024, 2), slo=SLO(ttft_ms=862))


def test_ttft_beside_a_decoding_sequence_hand_count():
    # batch 2: the other sequence takes a token of each 16-token step, so the prompt goes in
    # ⌈1,024 / 15⌉ = 69 chunks of 15. Bytes: 69 weight reads of 13,214,687,232 B; the prompt's
    # 1,024 K/V writes and 15 × (0 + 1 + … + 68) = 35,190 earlier-chunk reads; the other's
    # 69 decode tokens over 1,025 + 1 K/V entries each: (1,024 + 35,190 + 69 × 1,026) × 524,288 B
    # = 967,916,429,312 B -> 967.92 ms at 1 TB/s (FLOPs, ~14.5e12, take 14.5 ms at 1 PFLOP/s)
    plan = _plan("Llama-2-7B", step_tokens=16, workload=Workload(1024, 2))
    point = replica_point(plan.cost, ROUND, Workload(1024, 2), 2, 1, step_tokens=16)
    assert point.ttft_ms == pytest.approx(967.916429312)


def test_a_short_prompt_rides_in_the_decode_steps_weight_read():
    """Once each 16-token prompt was charged a standalone prefill, a whole weight read
    (13.22 ms here): ITL 21.39 ms for a 18.08 ms step. Llama-2-7B, batch 64, prompt 16, output 256.
    Decode step: 13,214,687,232 B of weights + 64 × (144 + 1) × 524,288 B of K/V
    = 18,080,079,872 B -> 18.080079872 ms (its 0.85e12 FLOPs take 0.85 ms).
    The prompt's own work: 16 × 12,952,010,752 + 262,144,000 lm_head + 524,288 × 16 × 17 / 2
    = 207,565,619,200 FLOPs -> 0.2075656192 ms, against 16 × 524,288 B of K/V writes (8.4 µs).
    One prompt arrives every 256 / 64 = 4 steps: ITL = 18.080079872 + 0.2075656192 / 4 ms."""
    workload = Workload(16, 256)
    plan = _plan("Llama-2-7B", workload=workload)
    point = replica_point(plan.cost, ROUND, workload, 64, 1, step_tokens=2048)
    assert point.step_ms == pytest.approx(18.080079872)
    assert point.itl_ms == pytest.approx(18.1319712768)
    # 64 sequences, a token each per 18.1319712768 ms step, 256 tokens per request
    assert point.requests_per_s == pytest.approx(64 / 256 / 18.1319712768e-3)


def test_a_long_prompt_still_costs_its_flops():
    """A compute-bound prompt costs what it did alone: 4,000 tokens are 56,003,657,728,000 FLOPs
    (test_prefill_llama2_7b_hand_count) -> 56.003657728 ms, against (4,000 + 2,045 earlier-chunk)
    × 524,288 B of K/V (3.17 ms) in ⌈4,000 / (2,048 − 3)⌉ = 2 chunks. Batch 4, output 64: the
    step reads 13,214,687,232 + 4 × (4,032 + 1) × 524,288 = 21,672,501,248 B -> 21.672501248 ms,
    and a prompt comes every 64 / 4 = 16 steps: ITL = 21.672501248 + 56.003657728 / 16 ms."""
    workload = Workload(4000, 64)
    plan = _plan("Llama-2-7B", workload=workload)
    point = replica_point(plan.cost, ROUND, workload, 4, 1, step_tokens=2048)
    assert point.itl_ms == pytest.approx(21.672501248 + 56.003657728 / 16)


def test_tensor_parallel_adds_allreduces():
    # Llama-3.1-70B over 2 devices: 2 all-reduces × 80 layers of one 8,192 × 2-byte vector,
    # a ring moves 2 × (2 − 1) / 2 of it at 1e11 B/s, plus 10 µs each: 160 × 10.16384 µs
    step = decode_step(_plan("Llama-3.1-70B", tp=2).cost, ROUND, 1, 100, tp=2)
    assert step.comm_s == pytest.approx(160 * (10e-6 + 16384 / 1e11))


def test_decode_turns_compute_bound_past_the_crossover():
    # a short context and a compute-poor device, so the batch FLOPs catch up with the weight reads
    hw = Hardware("slow-compute", 80 * 10**9, 1e12, {"bf16": 2e13}, 1e11, "test",
                  runtime_overhead_bytes=0, bandwidth_efficiency=1.0, compute_efficiency=1.0)
    cost = _plan("Llama-3.1-8B", hw).cost
    b = crossover_batch(cost, hw, context_len=128)
    assert b is not None and 1 < b < 256
    assert decode_step(cost, hw, math.floor(b), 128).bound == "memory"
    assert decode_step(cost, hw, math.ceil(b) + 1, 128).bound == "compute"


def test_throughput_grows_and_itl_grows_with_batch():
    plan = _plan("Llama-3.1-8B")
    tps = [p.output_tokens_per_s for p in plan.curve]
    itl = [p.itl_ms for p in plan.curve]
    assert tps == sorted(tps) and itl == sorted(itl)
    assert plan.curve[-1].batch == plan.max_batch


def test_measured_grid_keeps_itl_growing_with_batch():
    # a CPU-like grid where the 16-row kernel streams faster than the one-row one
    grid = Hardware("grid", 24 * 2**30, 8e9, {"bf16": 4e11}, 8e9, "test", runtime_overhead_bytes=0,
                    bandwidth_efficiency=1.0, compute_efficiency=1.0, layer_overhead_s=3e-4,
                    stream_rates={1: {512: 3e9, 4096: 6e9}, 16: {512: 5e9, 4096: 8e9}})
    plan = _plan(None, grid)
    itl = [p.itl_ms for p in plan.curve]
    assert itl == sorted(itl)


def test_capacity_respects_the_itl_slo():
    slo = SLO(itl_ms=20)
    plan = _plan("Llama-3.1-8B", slo=slo, request_rate=50)
    cap, wl = plan.capacity, plan.inputs.workload
    assert cap.limited_by == "itl_ms"
    assert cap.best.itl_ms <= 20
    beyond = replica_point(plan.cost, ROUND, wl, cap.best.batch + 1, 1, step_tokens=2048)
    assert beyond.itl_ms > 20
    assert cap.replicas == math.ceil(50 / cap.best.requests_per_s)


def test_tighter_slo_needs_more_replicas():
    loose = _plan("Llama-3.1-8B", slo=SLO(itl_ms=40), request_rate=100).capacity
    tight = _plan("Llama-3.1-8B", slo=SLO(itl_ms=16), request_rate=100).capacity
    assert tight.best.batch < loose.best.batch
    assert tight.replicas > loose.replicas


def test_cost_per_million_tokens_hand_case():
    # 1 request/s of 100 output tokens = 360,000 tokens an hour; one $3.60 device-hour -> $10
    plan = _plan(None, workload=Workload(100, 100), request_rate=1.0, price_per_gpu_hour=3.6)
    assert plan.capacity.replicas == 1
    assert plan.capacity.cost_per_million_output_tokens == pytest.approx(10.0)
    assert plan.capacity.cost_per_million_at_capacity < 10.0


def test_unreachable_slo_is_one_line():
    cost = _plan("Llama-2-7B").cost
    with pytest.raises(InferlabError) as e:
        plan_capacity(cost, ROUND, Workload(), SLO(itl_ms=1), max_batch=8, limited_by="max_num_seqs",
                      step_tokens=2048)
    assert "itl_ms" in str(e.value) and "\n" not in str(e.value)


def test_workload_and_slo_parsing():
    assert Workload.parse("prompt=512,output=64") == Workload(512, 64)
    assert SLO.parse("ttft_ms=500,itl_ms=50") == SLO(500, 50)
    for bad in ("promt=512", "prompt=abc", "prompt"):
        with pytest.raises(InferlabError, match="--workload"):
            Workload.parse(bad)
    with pytest.raises(InferlabError, match="positive"):
        SLO.parse("itl_ms=0")


def test_context_beyond_the_model_is_refused():
    with pytest.raises(InferlabError, match="exceeds"):
        _plan("Llama-2-7B", workload=Workload(4000, 200))


def test_the_step_budget_caps_the_batch_a_replica_keeps_up():
    """Prompts of 512 and replies of 16 in steps of 768 tokens: at batch 23 a step holds 23
    decodes and the 23 × 512 / 16 = 736 prompt tokens of the requests replacing those that
    finish (759 <= 768); at 24 it would need 24 + 768 = 792. The batch was once 162, with a
    TTFT of one prompt's steps and an ITL of seconds: the server missed that TTFT ~18 times."""
    workload = Workload(512, 16)
    plan = _plan("Llama-3.1-8B", step_tokens=768, workload=workload)
    assert plan.capacity.best.batch <= plan.max_batch == plan.capacity.max_batch == 23
    assert plan.capacity.limited_by == "max_num_batched_tokens"
