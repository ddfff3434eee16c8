"""Speed from the roofline: a step takes as long as the slower of reading its bytes at the
memory bandwidth and doing its FLOPs at the matmul rate (plus tensor-parallel all-reduces).

Decode reads every weight once per step whatever the batch, plus each sequence's KV cache, so
small batches are memory-bound; FLOPs grow with the batch, so past some batch decode turns
compute-bound. Prefill does a whole prompt's FLOPs against one read of the weights: compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.engine.block_manager import cdiv
from inferlab.models.config import ModelConfig
from inferlab.planner.budget import MemoryPlan, kv_head_copies, sharded_weight_bytes
from inferlab.planner.hardware import Hardware
from inferlab.planner.memory import (
    WeightBytes,
    WeightFormat,
    block_linear_params,
    dtype_bytes,
    kv_proj_params,
)

# one small all-reduce on NVLink/Infinity Fabric: the latency floor NCCL and custom
# all-reduce kernels show for decode-sized messages
ALLREDUCE_LATENCY_S = 10e-6


@dataclass(frozen=True)
class ModelCost:
    """Per device and per token, the numbers every step estimate is built from."""

    weight_bytes_per_step: int  # all weights but an untied embedding table (only rows are read)
    # 2 × block linear params / tp, k/v projections counted once per copy of their KV heads
    linear_flops_per_token: int
    lm_head_flops: int  # 2 × lm_head params / tp, per sequence and step: logits for its last token only
    attention_flops_per_context_token: int  # 4 × heads × head dim × layers / tp (QKᵀ and PV)
    kv_bytes_per_token: int
    allreduce_bytes_per_token: int  # each all-reduce's share: a hidden vector (dense dtype); 0 without tp
    num_allreduces: int  # per step: 2 a layer (after attention and after the MLP)
    num_layers: int  # each costs the hardware's layer overhead (operator launches) per step
    hidden_size: int  # picks the measured streaming rate on hardware that has a curve
    compute_dtype: str  # the block linears run at its rate
    dense_dtype: str  # lm_head and attention: left out of the weight format, they run at its rate


def model_cost(model: ModelConfig, weights: WeightBytes, fmt: WeightFormat, memory: MemoryPlan,
               tp: int) -> ModelCost:
    lm_head_params = model.vocab_size * model.hidden_size
    dense_bytes = dtype_bytes(fmt.dense_dtype)
    unread = 0 if model.tie_word_embeddings else lm_head_params * dense_bytes  # embedding gather
    layers = model.num_layers
    linear_params = block_linear_params(model) + (kv_head_copies(model, tp) - 1) * kv_proj_params(model)
    return ModelCost(
        weight_bytes_per_step=(sharded_weight_bytes(model, weights, tp) - unread) // tp,
        linear_flops_per_token=2 * linear_params // tp,
        lm_head_flops=2 * lm_head_params // tp,
        attention_flops_per_context_token=4 * model.num_heads * model.head_dim * layers // tp,
        kv_bytes_per_token=memory.kv_bytes_per_token,
        allreduce_bytes_per_token=0 if tp == 1 else model.hidden_size * dense_bytes,
        num_allreduces=0 if tp == 1 else 2 * layers,
        num_layers=layers,
        hidden_size=model.hidden_size,
        compute_dtype=fmt.compute_dtype,
        dense_dtype=fmt.dense_dtype,
    )


@dataclass(frozen=True)
class StepEstimate:
    """One step, or a prompt prefilled over `steps` steps (the figures are then their sums)."""

    tokens: int  # tokens computed, all steps together
    bytes_moved: int
    flops: int  # all of them: the block linears' and the dense ones
    dense_flops: int  # of `flops`, lm_head's and attention's
    memory_s: float  # bytes / (bandwidth × efficiency)
    compute_s: float  # linear FLOPs / (flops_dtype peak × efficiency) + dense FLOPs / (dense peak × …)
    comm_s: float  # tensor-parallel all-reduces
    overhead_s: float  # steps × layers × the hardware's host time to launch one layer
    flops_dtype: str  # whose peak the block linears' FLOPs were costed at
    dense_flops_dtype: str  # whose peak the dense FLOPs were costed at
    steps: int = 1
    kv_bytes: int = 0  # of bytes_moved, the KV cache's: at the hardware's KV rate

    @property
    def linear_flops(self) -> int:
        return self.flops - self.dense_flops

    @property
    def tokens_per_step(self) -> int:
        return cdiv(self.tokens, self.steps)

    @property
    def time_s(self) -> float:
        # over several steps this max of sums stands for the sum of each step's max: the steps of
        # one prompt are alike, so they share a bound
        return max(self.memory_s, self.compute_s) + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"


def _compute_s(cost: ModelCost, hw: Hardware, linear_flops: float, dense_flops: float) -> float:
    """Block linears at the weight format's compute rate; lm_head and attention at the dense
    dtype's (W8A8 quantizes neither: vLLM runs them in bf16)."""
    linear_peak, _ = hw.flops_for(cost.compute_dtype)
    dense_peak, _ = hw.flops_for(cost.dense_dtype)
    return (linear_flops / linear_peak + dense_flops / dense_peak) / hw.compute_efficiency


def _memory_s(cost: ModelCost, hw: Hardware, bytes_moved: int, kv_bytes: int, rows: int) -> float:
    """Weights at the rate they stream at, the KV cache at its own where the hardware has one."""
    weights_rate = hw.bandwidth_for(cost.hidden_size, rows) * hw.bandwidth_efficiency
    if not hw.kv_stream_rates:
        return bytes_moved / weights_rate
    kv_rate = hw.kv_bandwidth_for(cost.hidden_size, rows) * hw.bandwidth_efficiency
    return (bytes_moved - kv_bytes) / weights_rate + kv_bytes / kv_rate


def _estimate(cost: ModelCost, hw: Hardware, tokens: int, bytes_moved: int, flops: tuple[int, int],
              tp: int, steps: int = 1, own_steps: bool = True, kv_bytes: int = 0) -> StepEstimate:
    """`flops`: (block linears', dense). `own_steps` False: the work rides in steps that others
    launch, so it pays no per-step latency (all-reduce round trips, layer launches), only its
    own bytes, FLOPs and traffic."""
    linear_flops, dense_flops = flops
    ring = 2 * (tp - 1) / tp  # a ring all-reduce sends and receives this share of the message
    latency = steps * ALLREDUCE_LATENCY_S if own_steps else 0.0
    comm = cost.num_allreduces * (latency + ring * tokens * cost.allreduce_bytes_per_token
                                  / hw.interconnect_bytes_per_s)
    rows = cdiv(tokens, steps)
    return StepEstimate(
        tokens=tokens, bytes_moved=bytes_moved, flops=linear_flops + dense_flops,
        dense_flops=dense_flops,
        memory_s=_memory_s(cost, hw, bytes_moved, kv_bytes, rows),
        compute_s=_compute_s(cost, hw, linear_flops, dense_flops),
        comm_s=comm, overhead_s=steps * cost.num_layers * hw.layer_overhead_s if own_steps else 0.0,
        flops_dtype=hw.flops_for(cost.compute_dtype)[1], dense_flops_dtype=hw.flops_for(cost.dense_dtype)[1],
        steps=steps, kv_bytes=kv_bytes,
    )


def _decode_work(cost: ModelCost, batch: int, context_len: int) -> tuple[int, tuple[int, int]]:
    """(bytes, (linear, dense) FLOPs) of one decode token for each of `batch` sequences holding
    `context_len` tokens, besides the step's weight reads: every sequence's KV read and one new
    entry written."""
    kv = batch * (context_len + 1) * cost.kv_bytes_per_token
    dense = cost.lm_head_flops + context_len * cost.attention_flops_per_context_token
    return kv, (batch * cost.linear_flops_per_token, batch * dense)


def decode_step(cost: ModelCost, hw: Hardware, batch: int, context_len: int, tp: int = 1) -> StepEstimate:
    """One token for each of `batch` sequences holding `context_len` tokens: weights read once,
    every sequence's KV read and one new KV entry written."""
    kv, flops = _decode_work(cost, batch, context_len)
    return _estimate(cost, hw, batch, cost.weight_bytes_per_step + kv, flops, tp, kv_bytes=kv)


def _prefill_work(cost: ModelCost, prompt_len: int,
                  step_tokens: int | None) -> tuple[int, int, tuple[int, int]]:
    """(steps, bytes, (linear, dense) FLOPs) of a prompt in chunks of at most `step_tokens` (None: one step),
    besides the weight reads of its steps: logits for its last token; causal attention (token i
    attends to i tokens, however the prompt is cut); its K/V written, and read again by the
    later chunks."""
    chunk = min(step_tokens or prompt_len, prompt_len)
    steps = cdiv(prompt_len, chunk)
    attention = cost.attention_flops_per_context_token * prompt_len * (prompt_len + 1) // 2
    flops = prompt_len * cost.linear_flops_per_token, cost.lm_head_flops + attention
    earlier_kv_reads = chunk * steps * (steps - 1) // 2  # step k reads the k × chunk tokens before it
    return steps, (prompt_len + earlier_kv_reads) * cost.kv_bytes_per_token, flops


def prefill(cost: ModelCost, hw: Hardware, prompt_len: int, tp: int = 1,
            step_tokens: int | None = None) -> StepEstimate:
    """A prompt alone, in chunks of at most `step_tokens` (None: one step): each step reads the
    weights again."""
    steps, kv, flops = _prefill_work(cost, prompt_len, step_tokens)
    return _estimate(cost, hw, prompt_len, steps * cost.weight_bytes_per_step + kv, flops, tp, steps, kv_bytes=kv)


def prefill_riding(cost: ModelCost, hw: Hardware, prompt_len: int, decoding: int, tp: int,
                   step_tokens: int) -> StepEstimate:
    """A prompt chunked into the steps that `decoding` running sequences take anyway, in the
    `step_tokens` − `decoding` tokens they leave (as `time_to_first_token`): those steps read the
    weights once for all their tokens, so the prompt adds only its FLOPs and K/V traffic. Its
    time is what it adds to them: a short prompt's is its few tokens' FLOPs, not a weight read."""
    steps, kv, flops = _prefill_work(cost, prompt_len, step_tokens - decoding)
    return _estimate(cost, hw, prompt_len, kv, flops, tp, steps, own_steps=False, kv_bytes=kv)


def time_to_first_token(cost: ModelCost, hw: Hardware, prompt_len: int, decoding: int,
                        context_len: int, tp: int, step_tokens: int) -> StepEstimate:
    """A prompt prefilled beside `decoding` running sequences (holding `context_len` tokens): the
    scheduler gives each of them a token of every step first, so the prompt goes in chunks of the
    `step_tokens` − `decoding` left, and each of its steps also carries their decode work (the
    weights are read once a step for all). With nothing else decoding it is the plain prefill."""
    alone = prefill(cost, hw, prompt_len, tp, step_tokens - decoding)
    kv, (linear, dense) = _decode_work(cost, decoding, context_len)
    return _estimate(cost, hw, alone.tokens + alone.steps * decoding, alone.bytes_moved + alone.steps * kv,
                     (alone.linear_flops + alone.steps * linear, alone.dense_flops + alone.steps * dense),
                     tp, alone.steps, kv_bytes=alone.kv_bytes + alone.steps * kv)


def crossover_batch(cost: ModelCost, hw: Hardware, context_len: int) -> float | None:
    """The batch where decode's compute time reaches its memory time, or None if it never does
    (when each sequence's KV reads grow faster than its FLOPs). Measured streaming rates that
    vary with the batch are taken at their largest-batch value."""
    bw = hw.bandwidth_for(cost.hidden_size, rows=2**20) * hw.bandwidth_efficiency
    kv_bw = hw.kv_bandwidth_for(cost.hidden_size, rows=2**20) * hw.bandwidth_efficiency
    _, flops = _decode_work(cost, 1, context_len)
    compute_per_seq = _compute_s(cost, hw, *flops)
    memory_per_seq = (context_len + 1) * cost.kv_bytes_per_token / kv_bw
    if compute_per_seq <= memory_per_seq:
        return None
    return cost.weight_bytes_per_step / bw / (compute_per_seq - memory_per_seq)


@dataclass(frozen=True)
class CurvePoint:
    batch: int
    step: StepEstimate

    @property
    def itl_ms(self) -> float:
        return self.step.time_s * 1e3

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch / self.step.time_s


def batch_sizes(max_batch: int) -> list[int]:
    """Powers of two up to `max_batch`, and `max_batch` itself."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return [*sizes, max_batch]


def throughput_curve(cost: ModelCost, hw: Hardware, context_len: int, max_batch: int,
                     tp: int = 1) -> list[CurvePoint]:
    return [CurvePoint(b, decode_step(cost, hw, b, context_len, tp)) for b in batch_sizes(max_batch)]
