"""The KV cache's size on a GPU: what --gpu-memory-utilization leaves once the weights and the
largest step's activations are counted, the step measured by running it once (vLLM's profile
run) before the cache exists."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferlab.engine.block_manager import cdiv
from inferlab.engine.sampler import SamplingBatch, sample
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError
from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions
from inferlab.models.llama import LlamaForCausalLM
from inferlab.planner.units import format_bytes


@dataclass(frozen=True)
class DeviceMemory:
    total_bytes: int
    peak_torch_bytes: int  # torch's peak while profiling: weights + the largest step's activations
    non_torch_bytes: int  # used outside torch's allocator: CUDA context, workspaces, other processes

    def kv_cache_bytes(self, utilization: float) -> int:
        """What `utilization` of the device leaves for the KV cache; raises when nothing is left."""
        usable = int(self.total_bytes * utilization)
        kv = usable - self.peak_torch_bytes - self.non_torch_bytes
        if kv <= 0:
            raise InferlabError(
                f"no room for a KV cache: weights and activations take "
                f"{format_bytes(self.peak_torch_bytes)}, other memory {format_bytes(self.non_torch_bytes)}, "
                f"of the {format_bytes(usable)} that --gpu-memory-utilization {utilization:g} allows; "
                "raise it, or set --kv-cache-memory")
        return kv


def profile_query_lens(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int) -> list[int]:
    """The largest step the scheduler can build: as many tokens as a step takes, spread over as
    many prompts as it holds (every one sampled), none longer than the context."""
    seqs = min(max_num_seqs, max_num_batched_tokens)
    tokens = min(max_num_batched_tokens, seqs * max_model_len)
    return [tokens // seqs + (i < tokens % seqs) for i in range(seqs)]


def run_profile_step(model: LlamaForCausalLM, query_lens: list[int], block_size: int,
                     dtype: torch.dtype, device: torch.device) -> int:
    """Run that step (prefill of every sequence, then top-k/top-p sampling of each) on a cache
    just large enough; returns the cache's bytes."""
    cfg = model.config
    tables, first = [], 0
    for n in query_lens:
        blocks = cdiv(n, block_size)
        tables.append(list(range(first, first + blocks)))
        first += blocks
    shape = (first, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
              for _ in range(cfg.num_layers)]
    meta = AttentionMetadata.build(query_lens, query_lens, tables, block_size, device)
    _, positions = token_positions(query_lens, query_lens)
    ids = torch.zeros(sum(query_lens), dtype=torch.int64, device=device)
    hidden = model(ids, positions.to(device), caches, meta)  # [N, hidden]
    logits = model.compute_logits(hidden[meta.query_start_loc[1:].long() - 1])  # [B, V]
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9)
    rows = len(query_lens)
    sample(logits, SamplingBatch([params] * rows, [None] * rows, [[]] * rows, [[]] * rows))
    return 2 * len(caches) * caches[0][0].numel() * caches[0][0].element_size()


@torch.inference_mode()
def profile_device_memory(model: LlamaForCausalLM, query_lens: list[int], block_size: int,
                          dtype: torch.dtype, device: torch.device) -> DeviceMemory:
    """Weights are on the device already; measures the step's peak on top of them (CUDA only)."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    cache_bytes = run_profile_step(model, query_lens, block_size, dtype, device)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - cache_bytes
    free, total = torch.cuda.mem_get_info(device)
    non_torch = (total - free) - torch.cuda.memory_reserved(device)
    torch.cuda.empty_cache()
    return DeviceMemory(total_bytes=total, peak_torch_bytes=peak, non_torch_bytes=max(non_torch, 0))
