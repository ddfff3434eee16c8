"""One device's memory: weights, activations, runtime overhead, and what is left for the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.config import EngineConfig
from inferlab.engine.args import SERVING_MAX_NUM_BATCHED_TOKENS
from inferlab.engine.block_manager import cdiv
from inferlab.engine.kv_cache_config import check_block_size
from inferlab.engine.scheduler_config import SchedulerConfig
from inferlab.errors import InferlabError
from inferlab.models.config import ModelConfig
from inferlab.planner.memory import (
    DTYPE_BYTES,
    WeightBytes,
    dtype_bytes,
    kv_cache_bytes_per_token,
    num_kv_blocks,
)
from inferlab.planner.names import unknown_name_message
from inferlab.planner.units import format_bytes

KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")
ENGINE = EngineConfig()  # plan for inferlab's own engine: its scheduling defaults are ours
LOGITS_BYTES = 4  # logits and probabilities are kept in fp32 for sampling


@dataclass(frozen=True)
class MemoryConfig:
    """What the user chose; everything is per device unless the name says otherwise."""

    device_memory_bytes: int
    gpu_memory_utilization: float = ENGINE.gpu_memory_utilization  # share the server may take
    tensor_parallel: int = 1
    kv_dtype: str = "bf16"
    block_size: int = ENGINE.block_size  # tokens per KV block
    max_num_seqs: int = ENGINE.max_num_seqs  # sequences in one step: sets the logits buffer
    # sets the activation peak; `inferlab serve`'s step, as a plan is for serving
    max_num_batched_tokens: int = SERVING_MAX_NUM_BATCHED_TOKENS
    runtime_overhead_bytes: int = 0  # CUDA context, graphs, workspaces, allocator slack
    kv_cache_bytes: int | None = None  # a fixed KV budget (the engine's kv_cache_memory)

    def __post_init__(self) -> None:
        if self.device_memory_bytes <= 0:
            raise InferlabError(f"device memory must be positive, got {self.device_memory_bytes} bytes")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InferlabError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_dtype not in KV_DTYPES:
            raise InferlabError(unknown_name_message("KV dtype", self.kv_dtype, KV_DTYPES))
        check_block_size(self.block_size)  # as the engine takes it
        if self.tensor_parallel < 1:
            raise InferlabError(f"tensor_parallel must be at least 1, got {self.tensor_parallel}")
        # the step limits as the engine checks them (chunked prefill on: max_model_len is moot)
        SchedulerConfig(max_model_len=1, max_num_seqs=self.max_num_seqs,
                        max_num_batched_tokens=self.max_num_batched_tokens)
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise InferlabError(f"KV cache memory must be positive, got {self.kv_cache_bytes} bytes")


def kv_heads_per_device(model: ModelConfig, tp: int) -> int:
    """KV heads split across devices; with more devices than KV heads each holds a copy of one."""
    if model.num_heads % tp:
        raise InferlabError(
            f"tensor parallel {tp} does not divide the model's {model.num_heads} attention heads")
    if model.num_kv_heads % tp == 0:
        return model.num_kv_heads // tp
    if tp % model.num_kv_heads == 0:
        return 1
    raise InferlabError(
        f"tensor parallel {tp} and the model's {model.num_kv_heads} KV heads do not divide each other")


def kv_head_copies(model: ModelConfig, tp: int) -> int:
    """Devices holding each KV head: 1, or tp / KV heads where tp exceeds them (as vLLM does)."""
    return tp * kv_heads_per_device(model, tp) // model.num_kv_heads


def sharded_weight_bytes(model: ModelConfig, weights: WeightBytes, tp: int) -> int:
    """The weights' bytes on all `tp` devices together: each once, but k_proj and v_proj once
    per copy of their KV heads (a device computes the K/V of the heads it holds)."""
    return weights.total_bytes + (kv_head_copies(model, tp) - 1) * weights.kv_proj_bytes


def activation_bytes(model: ModelConfig, cfg: MemoryConfig, act_bytes: int) -> int:
    """Peak activations of one step: the residual stream and its normed copy (2 × hidden), the
    MLP's gate, up and gated product (3 × intermediate / tp) for every batched token, plus fp32
    logits and probabilities for every sequence a step samples."""
    per_token = 2 * model.hidden_size + 3 * model.intermediate_size // cfg.tensor_parallel
    logits = 2 * cfg.max_num_seqs * model.vocab_size * LOGITS_BYTES
    return cfg.max_num_batched_tokens * per_token * act_bytes + logits


@dataclass(frozen=True)
class MemoryPlan:
    """Per device. `kv_cache_bytes` = usable − weights − activations − overhead (or fixed)."""

    device_memory_bytes: int
    usable_bytes: int  # device memory × utilization
    weight_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int  # 2 × layers × KV heads per device × head dim × KV dtype bytes
    kv_heads: int  # per device
    block_size: int
    num_blocks: int
    fixed_kv_budget: bool

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    def blocks_for(self, tokens: int) -> int:
        """The KV blocks one sequence of `tokens` tokens holds: whole blocks only."""
        return cdiv(tokens, self.block_size)

    def max_sequences(self, context_len: int) -> int:
        """Sequences of `context_len` tokens that fit at once."""
        return self.num_blocks // self.blocks_for(context_len)


def plan_memory(model: ModelConfig, weights: WeightBytes, cfg: MemoryConfig,
                act_dtype: str = "bf16", hardware_name: str = "the device") -> MemoryPlan:
    tp = cfg.tensor_parallel
    heads = kv_heads_per_device(model, tp)
    per_token = kv_cache_bytes_per_token(model.num_layers, heads, model.head_dim,
                                         DTYPE_BYTES[cfg.kv_dtype])
    usable = int(cfg.device_memory_bytes * cfg.gpu_memory_utilization)
    weights_per_device = cdiv(sharded_weight_bytes(model, weights, tp), tp)
    activations = activation_bytes(model, cfg, dtype_bytes(act_dtype))
    taken = weights_per_device + activations + cfg.runtime_overhead_bytes
    kv = usable - taken if cfg.kv_cache_bytes is None else cfg.kv_cache_bytes
    if cfg.kv_cache_bytes is not None and taken + kv > cfg.device_memory_bytes:
        raise InferlabError(
            f"does not fit: weights {format_bytes(weights_per_device)} + activations "
            f"{format_bytes(activations)} + overhead {format_bytes(cfg.runtime_overhead_bytes)} + "
            f"KV cache {format_bytes(kv)} exceed {format_bytes(cfg.device_memory_bytes)} on {hardware_name}")
    blocks = num_kv_blocks(max(kv, 0), cfg.block_size, per_token)
    if blocks == 0 and cfg.kv_cache_bytes is not None:  # the budget, not the device, is short
        raise InferlabError(
            f"does not fit: the KV cache budget of {format_bytes(kv)} (--kv-cache-memory) is less "
            f"than one KV block ({format_bytes(cfg.block_size * per_token)}: {cfg.block_size} tokens "
            f"× {per_token:,} B); give at least that")
    if blocks == 0:
        short = (f"leave {format_bytes(kv)}, less than one KV block ({format_bytes(cfg.block_size * per_token)})"
                 if kv > 0 else f"= {format_bytes(taken)}")
        remedy = "a larger --tensor-parallel, a smaller --weight-format (int4-g128) or other hardware"
        if kv > 0 and cfg.block_size > 16:  # room left, but less than one of these large blocks
            remedy = f"a smaller --block-size (16 tokens: {format_bytes(16 * per_token)} a block)"
        raise InferlabError(
            f"does not fit: weights {format_bytes(weights_per_device)} + activations "
            f"{format_bytes(activations)} + overhead {format_bytes(cfg.runtime_overhead_bytes)} {short} "
            f"of the {format_bytes(usable)} usable on {hardware_name}; try {remedy}")
    return MemoryPlan(
        device_memory_bytes=cfg.device_memory_bytes, usable_bytes=usable,
        weight_bytes=weights_per_device, activation_bytes=activations,
        overhead_bytes=cfg.runtime_overhead_bytes, kv_cache_bytes=kv,
        kv_bytes_per_token=per_token, kv_heads=heads, block_size=cfg.block_size,
        num_blocks=blocks, fixed_kv_budget=cfg.kv_cache_bytes is not None,
    )
