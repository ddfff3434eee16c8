"""The console report: every figure next to the factors it came from."""

from __future__ import annotations

from inferlab.planner.budget import LOGITS_BYTES, kv_head_copies
from inferlab.planner.hardware import Hardware
from inferlab.planner.memory import DTYPE_BYTES
from inferlab.planner.plan import Plan
from inferlab.planner.roofline import StepEstimate
from inferlab.planner.units import format_bytes, format_rate


def _header(plan: Plan) -> list[str]:
    i = plan.inputs
    m, hw = i.model.config, i.hardware
    peak, used = hw.flops_for(i.weight_format.compute_dtype)
    dense_peak, dense = hw.flops_for(i.weight_format.dense_dtype)
    dense_rate = f" ({dense} {format_rate(dense_peak, 'FLOP/s')} for lm_head and attention)" if dense != used else ""
    return [
        f"inferlab plan: {i.model.name} on {hw.name} ({i.weight_format.name} weights, "
        f"{i.memory.kv_dtype} KV cache, tensor parallel {i.memory.tensor_parallel})",
        f"  model     {m.num_layers} layers, hidden {m.hidden_size}, MLP {m.intermediate_size}, "
        f"{m.num_heads} heads / {m.num_kv_heads} KV heads × {m.head_dim}, vocab {m.vocab_size}, "
        f"{m.num_parameters() / 1e9:.3g} B params  [{i.model.source}]",
        f"  hardware  {format_bytes(hw.memory_bytes)} memory, {format_rate(hw.memory_bandwidth_bytes_per_s, 'B/s')}"
        f" × {hw.bandwidth_efficiency:g}, {used} {format_rate(peak, 'FLOP/s')}{dense_rate} × "
        f"{hw.compute_efficiency:g}  [{hw.source}]",
    ]


def _kv_source(plan: Plan) -> str:
    i, mem = plan.inputs, plan.memory
    if not mem.fixed_kv_budget:
        return (f"{format_bytes(mem.usable_bytes)} usable ({format_bytes(mem.device_memory_bytes)} × "
                f"{i.memory.gpu_memory_utilization:g}) − the above")
    if i.memory.kv_cache_bytes == i.hardware.engine_kv_cache_bytes:
        return f"the engine's default on {i.hardware.name} (--kv-cache-memory sets it)"
    return "fixed by --kv-cache-memory"


# how gguf_held.py's ways of holding a weight read in the weights line
_HELD_AS = {"Q4_0": "Q4_0 codes", "Q4_1": "Q4_1 codes", "Q8_0": "Q8_0 codes"}


def _memory(plan: Plan) -> list[str]:
    i, w, mem = plan.inputs, plan.weights, plan.memory
    m, cfg, fmt = i.model.config, i.memory, i.weight_format
    tp = f" / {cfg.tensor_parallel} devices" if cfg.tensor_parallel > 1 else ""
    copies = kv_head_copies(m, cfg.tensor_parallel)
    replicated = (f" (+ {copies - 1} more cop{'y' if copies == 2 else 'ies'} of k_proj, v_proj: "
                  f"{format_bytes(w.kv_proj_bytes)} each, as each KV head is on {copies} devices)"
                  if copies > 1 else "")
    scales = (f" + {w.num_scales:,} scales × {fmt.scale_bytes} B" if w.num_scales else "")
    zeros = f" + {w.zero_point_bytes:,} B of {fmt.bits}-bit zero points" if w.zero_point_bytes else ""
    group = (" (per-tensor scales)" if fmt.scale_rows is None
             else f" (blocks of {fmt.scale_rows} × {fmt.group_size})" if fmt.scale_rows > 1
             else f" (group {fmt.group_size})" if fmt.group_size else "")
    ctx_blocks = mem.blocks_for(plan.context_len)
    split = (" + ".join(f"{params:,} params as {_HELD_AS.get(how, how)} ({nbytes / params:.4g} B each)"
                        for how, params, nbytes in w.held) if w.held else
             f"{w.quantized_params:,} linear params × {fmt.bits} bits{group}{scales}{zeros} + "
             f"{w.dense_params:,} other params × {DTYPE_BYTES[fmt.dense_dtype]} B")
    lines = [
        "Memory (per device)",
        f"  weights           {format_bytes(mem.weight_bytes):>12}   {split}{replicated}{tp}",
        f"  activations       {format_bytes(mem.activation_bytes):>12}   {cfg.max_num_batched_tokens} tokens × "
        f"(2 × {m.hidden_size} + 3 × {m.intermediate_size}{tp and f' / {cfg.tensor_parallel}'}) × "
        f"{DTYPE_BYTES[fmt.dense_dtype]} B + 2 × {cfg.max_num_seqs} seqs × {m.vocab_size} vocab × {LOGITS_BYTES} B",
        f"  runtime overhead  {format_bytes(mem.overhead_bytes):>12}   context, graphs, workspaces",
        f"  KV cache          {format_bytes(mem.kv_cache_bytes):>12}   {_kv_source(plan)}",
        f"    per token       {mem.kv_bytes_per_token:>10,} B   2 × {m.num_layers} layers × {mem.kv_heads} KV heads"
        f" × {m.head_dim} head dim × {DTYPE_BYTES[cfg.kv_dtype]} B ({cfg.kv_dtype})",
        f"    blocks          {mem.num_blocks:>12,}   of {mem.block_size} tokens ({format_bytes(mem.block_bytes)}"
        f" each): {mem.kv_tokens:,} tokens",
        f"    sequences       {mem.max_sequences(plan.context_len):>12,}   of {plan.context_len:,} tokens "
        f"({ctx_blocks} block{'' if ctx_blocks == 1 else 's'} each) at once",
        f"    batch limit     {plan.max_batch:>12,}   {_workload_fit(plan)}max_num_seqs {cfg.max_num_seqs}, "
        f"max_num_batched_tokens {cfg.max_num_batched_tokens}{_step_budget_batch(plan)}",
    ]
    return lines


def _step_budget_batch(plan: Plan) -> str:
    """The batch the step budget keeps up, B × O / (P + O), where it is what binds."""
    cfg, wl = plan.inputs.memory, plan.inputs.workload
    if plan.batch_limited_by != "max_num_batched_tokens":
        return ""
    return (f" (its steps keep {cfg.max_num_batched_tokens} × {wl.output_tokens} / "
            f"{wl.context_len:,} sequences decoding: each also takes the prompts of those that finish)")


def _workload_fit(plan: Plan) -> str:
    """How many of the workload's sequences fit, where --context-len made the line above
    count sequences of another length."""
    length = plan.inputs.workload.context_len
    if length == plan.context_len:
        return ""
    return f"the workload's sequences of {length:,} tokens: {plan.memory.max_sequences(length):,} fit, "


def _tokens_per_s(rate: float) -> str:
    """Whole tokens/s, or three figures below 100 (a long prompt's few tokens/s are not 0)."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def _step_factors(step: StepEstimate, plan: Plan) -> str:
    hw = plan.inputs.hardware
    if step.bound == "compute":
        why = _compute_factors(step, hw)
    else:
        bandwidth = hw.bandwidth_for(plan.cost.hidden_size, step.tokens_per_step)
        rows = f"{step.tokens_per_step} row{'s' if step.tokens_per_step > 1 else ''}"
        width = f" at width {plan.cost.hidden_size}, {rows}" if hw.stream_rates else ""
        efficiency = f" × {hw.bandwidth_efficiency:g}"
        why = f"{format_rate(step.bytes_moved, 'B')} / ({format_rate(bandwidth, 'B/s')}{width}{efficiency})"
        if hw.kv_stream_rates:  # the weights and the KV cache at their own rates
            kv_rate = hw.kv_bandwidth_for(plan.cost.hidden_size, step.tokens_per_step)
            why = (f"{format_rate(step.bytes_moved - step.kv_bytes, 'B')} of weights / ({format_rate(bandwidth, 'B/s')}"
                   f"{width}{efficiency}) + {format_rate(step.kv_bytes, 'B')} of KV cache / "
                   f"({format_rate(kv_rate, 'B/s')}{efficiency})")
    comm = f" + {step.comm_s * 1e3:.2f} ms all-reduce" if step.comm_s else ""
    steps = f"{step.steps} steps × " if step.steps > 1 else ""
    ops = (f" + {steps}{plan.cost.num_layers} layers × {hw.layer_overhead_s * 1e6:.0f} µs launch overhead"
           if step.overhead_s else "")
    return f"{step.bound}-bound: {why}{comm}{ops}"


def _compute_factors(step: StepEstimate, hw: Hardware) -> str:
    """FLOPs / (peak × efficiency); split where the linears and the rest run at different rates."""
    parts = ([(step.flops, step.flops_dtype)] if step.flops_dtype == step.dense_flops_dtype
             else [(step.linear_flops, step.flops_dtype), (step.dense_flops, step.dense_flops_dtype)])
    return " + ".join(f"{format_rate(flops, 'FLOP')} / ({format_rate(hw.peak_flops[dtype], 'FLOP/s')} × "
                      f"{hw.compute_efficiency:g})" for flops, dtype in parts)


def _chunks(plan: Plan) -> str:
    step = plan.prefill
    if step.steps == 1:
        return ""
    return f" in {step.steps} steps of up to {plan.inputs.memory.max_num_batched_tokens} (max_num_batched_tokens)"


def _speed(plan: Plan) -> list[str]:
    wl = plan.inputs.workload
    lines = [
        f"Speed (roofline; decode attends to {wl.mean_decode_context} tokens, the workload's mean)",
        f"  TTFT   {plan.prefill.time_s * 1e3:10.2f} ms   prefill of {wl.prompt_tokens} tokens{_chunks(plan)}, "
        f"{_step_factors(plan.prefill, plan)}",
        f"  ITL    {plan.decode_batch1.time_s * 1e3:10.2f} ms   decode step at batch 1, "
        f"{_step_factors(plan.decode_batch1, plan)}",
        f"  {'batch':>7} {'ITL ms':>10} {'tokens/s':>12}  bound",
    ]
    lines += [f"  {p.batch:>7} {p.itl_ms:>10.2f} {_tokens_per_s(p.output_tokens_per_s):>12}  {p.step.bound}"
              for p in plan.curve]
    if plan.crossover_batch is None:
        lines.append("  decode stays memory-bound at every batch: each sequence's KV reads cost more "
                     "time than its FLOPs")
    else:
        lines.append(f"  decode turns compute-bound at batch ≈ {plan.crossover_batch:.0f}")
    return lines


def _capacity(plan: Plan) -> list[str]:
    i, cap = plan.inputs, plan.capacity
    slo = ", ".join(f"{k}={v:g}" for k, v in (("ttft_ms", i.slo.ttft_ms), ("itl_ms", i.slo.itl_ms))
                    if v is not None) or "none"
    best = cap.best
    lines = [
        f"Capacity (workload prompt={i.workload.prompt_tokens},output={i.workload.output_tokens}; SLO {slo})",
        f"  per replica  batch {best.batch} (limited by {cap.limited_by}): {best.requests_per_s:.3g} req/s, "
        f"{_tokens_per_s(cap.output_tokens_per_s_per_replica)} output tokens/s, TTFT {best.ttft_ms:.1f} ms, "
        f"ITL {best.itl_ms:.2f} ms",
    ]
    if cap.replicas is not None:
        lines.append(f"  for {cap.request_rate:g} req/s  {cap.replicas} replica(s) × {cap.gpus_per_replica} "
                     f"device(s) = {cap.gpus} device(s)")
    if cap.cost_per_million_at_capacity is not None:
        at_rate = cap.cost_per_million_output_tokens
        rate_text = "" if at_rate is None else f"${at_rate:.3f} at {cap.request_rate:g} req/s; "
        lines.append(f"  cost         {rate_text}${cap.cost_per_million_at_capacity:.3f} at full load "
                     f"(per million output tokens, ${cap.price_per_gpu_hour:g}/device-hour)")
    return lines


def render_text(plan: Plan) -> str:
    sections = [_header(plan), _memory(plan), _speed(plan), _capacity(plan)]
    if plan.notes:
        sections.append(["Notes", *(f"  {n}" for n in plan.notes)])
    return "\n\n".join("\n".join(s) for s in sections) + "\n"
