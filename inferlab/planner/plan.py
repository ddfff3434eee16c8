"""One plan: the model and hardware in, memory, speed and capacity out, every figure with the
factors it came from (`Plan.to_dict` is the `--json` output)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from inferlab.errors import InferlabError
from inferlab.planner.budget import MemoryConfig, MemoryPlan, plan_memory
from inferlab.planner.capacity import (
    SLO,
    CapacityPlan,
    Workload,
    check_rate_and_price,
    plan_capacity,
)
from inferlab.planner.hardware import Hardware
from inferlab.planner.memory import WeightBytes, WeightFormat, weight_bytes
from inferlab.planner.model_shapes import ModelSpec
from inferlab.planner.roofline import (
    CurvePoint,
    ModelCost,
    StepEstimate,
    crossover_batch,
    decode_step,
    model_cost,
    throughput_curve,
    time_to_first_token,
)


@dataclass(frozen=True)
class PlanInputs:
    model: ModelSpec
    hardware: Hardware
    weight_format: WeightFormat
    memory: MemoryConfig
    workload: Workload
    slo: SLO
    request_rate: float | None = None  # requests/s to serve
    price_per_gpu_hour: float | None = None
    # only for the concurrency figure (sequences of this length that fit); capacity and cost
    # follow the workload's own length. Default: the workload's
    context_len: int | None = None

    def __post_init__(self) -> None:
        check_rate_and_price(self.request_rate, self.price_per_gpu_hour)
        if self.context_len is not None and self.context_len < 1:
            raise InferlabError(f"--context-len must be at least 1, got {self.context_len}")


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    weights: WeightBytes
    memory: MemoryPlan
    cost: ModelCost
    context_len: int  # of the concurrency figure
    max_batch: int  # the workload's sequences that fit, capped by max_num_seqs and the step budget
    batch_limited_by: str  # which of memory, max_num_seqs, max_num_batched_tokens sets max_batch
    prefill: StepEstimate  # the workload's prompt alone: the TTFT at batch 1
    decode_batch1: StepEstimate
    curve: list[CurvePoint]
    crossover_batch: float | None
    capacity: CapacityPlan
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        def step(s: StepEstimate) -> dict[str, Any]:
            return asdict(s) | {"time_ms": s.time_s * 1e3, "bound": s.bound}

        inputs = self.inputs
        cap = self.capacity
        return {
            "model": {"name": inputs.model.name, "source": inputs.model.source,
                      "config": {k: v for k, v in asdict(inputs.model.config).items() if k != "extra"}},
            "hardware": asdict(inputs.hardware),
            "weight_format": {k: v for k, v in asdict(inputs.weight_format).items() if k != "gguf_types"},
            "memory_config": asdict(inputs.memory),
            "workload": asdict(inputs.workload),
            "slo": asdict(inputs.slo),
            "weights": asdict(self.weights) | {"total_bytes": self.weights.total_bytes,
                                               "total_params": self.weights.total_params},
            "memory": asdict(self.memory) | {"kv_tokens": self.memory.kv_tokens,
                                             "block_bytes": self.memory.block_bytes,
                                             "context_len": self.context_len,
                                             "max_sequences": self.memory.max_sequences(self.context_len),
                                             "max_batch": self.max_batch},
            "cost_model": asdict(self.cost),
            "prefill": step(self.prefill),
            "ttft_ms": self.prefill.time_s * 1e3,
            "decode_batch1": step(self.decode_batch1),
            "curve": [{"batch": p.batch, "itl_ms": p.itl_ms,
                       "output_tokens_per_s": p.output_tokens_per_s, "bound": p.step.bound}
                      for p in self.curve],
            "crossover_batch": self.crossover_batch,
            "capacity": asdict(cap) | {
                "output_tokens_per_s_per_replica": cap.output_tokens_per_s_per_replica,
                "cost_per_million_output_tokens": cap.cost_per_million_output_tokens,
                "cost_per_million_at_capacity": cap.cost_per_million_at_capacity},
            "notes": list(self.notes),
        }


def batch_limit(cfg: MemoryConfig, fitting: int, workload: Workload) -> tuple[int, str]:
    """The most sequences that decode together, and what sets it: `fitting` (memory), one
    step's max_num_seqs, or the batch its max_num_batched_tokens keeps up: a steady state's
    steps hold the b decodes and, for the b / O requests that replace those finishing,
    b × P / O prompt tokens, so b (P + O) / O <= B (past it the steps are full and prompts
    queue: a TTFT without bound, an ITL no longer capacity.py's formula)."""
    sustained = cfg.max_num_batched_tokens * workload.output_tokens // workload.context_len
    limits = {"max_num_seqs": cfg.max_num_seqs, "memory": fitting,
              "max_num_batched_tokens": max(1, sustained)}
    limited_by = min(limits, key=limits.__getitem__)
    return limits[limited_by], limited_by


def build_plan(inputs: PlanInputs) -> Plan:
    model, hw, fmt = inputs.model.config, inputs.hardware, inputs.weight_format
    tp = inputs.memory.tensor_parallel
    sequence = inputs.workload.context_len  # what the scheduler admits a request by
    context = inputs.context_len or sequence
    for tokens, what in ((sequence, "the workload's prompt + output"), (context, "--context-len")):
        if tokens > model.max_context:
            raise InferlabError(f"context of {tokens} tokens ({what}) exceeds {inputs.model.name}'s "
                                f"maximum of {model.max_context}")
    weights = weight_bytes(model, fmt)
    memory = plan_memory(model, weights, inputs.memory, fmt.dense_dtype, hw.name)
    longest = max(sequence, context)
    if memory.max_sequences(longest) == 0:
        raise InferlabError(
            f"does not fit: one sequence of {longest} tokens needs {memory.blocks_for(longest)} "
            f"KV blocks, only {memory.num_blocks} fit on {hw.name}")
    max_batch, limited_by = batch_limit(inputs.memory, memory.max_sequences(sequence), inputs.workload)
    step_tokens = inputs.memory.max_num_batched_tokens
    cost = model_cost(model, weights, fmt, memory, tp)
    notes = []
    _, used = hw.flops_for(fmt.compute_dtype)
    if used != fmt.compute_dtype and not (fmt.compute_dtype == "fp16" and used == "bf16"):
        notes.append(f"{hw.name} lists no {fmt.compute_dtype} rate: matmuls are costed at its {used} rate")
    capacity = plan_capacity(cost, hw, inputs.workload, inputs.slo, max_batch, limited_by,
                             step_tokens, tp=tp, request_rate=inputs.request_rate,
                             price_per_gpu_hour=inputs.price_per_gpu_hour)
    decode_context = inputs.workload.mean_decode_context
    return Plan(
        inputs=inputs, weights=weights, memory=memory, cost=cost, context_len=context,
        max_batch=max_batch, batch_limited_by=limited_by,
        prefill=time_to_first_token(cost, hw, inputs.workload.prompt_tokens, 0, decode_context, tp,
                                    step_tokens),
        decode_batch1=decode_step(cost, hw, 1, decode_context, tp),
        curve=throughput_curve(cost, hw, decode_context, max_batch, tp),
        crossover_batch=crossover_batch(cost, hw, decode_context),
        capacity=capacity, notes=tuple(notes),
    )
