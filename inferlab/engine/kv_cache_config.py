"""How the paged KV cache is laid out: block size, pool size, prefix caching."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from inferlab.engine.block_manager import cdiv
from inferlab.errors import InferlabError
from inferlab.planner.memory import num_kv_blocks
from inferlab.planner.units import format_bytes

logger = logging.getLogger("inferlab.engine")


def check_block_size(block_size: int) -> None:
    """Block sizes the kernels take: a power of two (checked before any model loads)."""
    if block_size < 1 or block_size & (block_size - 1):
        raise InferlabError(f"block_size must be a power of two, got {block_size}")


@dataclass(frozen=True)
class CacheConfig:
    """The KV block pool the block manager hands out, sized by the engine (KVPool)."""

    num_blocks: int  # KV blocks in the pool
    block_size: int = 16  # tokens per KV block
    enable_prefix_caching: bool = True  # reuse full blocks of earlier requests by chained hash

    def __post_init__(self) -> None:
        check_block_size(self.block_size)
        if self.num_blocks < 1:
            raise InferlabError(
                f"the KV cache needs at least one block, got num_blocks={self.num_blocks}")


@dataclass(frozen=True)
class KVPool:
    """The pool a byte budget buys: whole blocks of block_size tokens."""

    num_blocks: int
    block_size: int
    bytes_per_token: int

    @classmethod
    def from_budget(cls, budget_bytes: int, block_size: int, bytes_per_token: int,
                    asked_bytes: int | None) -> KVPool:
        """asked_bytes: --kv-cache-memory (None: the budget is what the GPU profile left, or the
        CPU's fixed default). Less than a block is refused before the context is fitted to the
        pool."""
        num_blocks = num_kv_blocks(budget_bytes, block_size, bytes_per_token)
        if num_blocks < 1:
            block_bytes = block_size * bytes_per_token
            # the device is not known here, and a CPU ignores --gpu-memory-utilization: the
            # flags that work on both come first (on a CPU, only a huge block gets here)
            fix = ("give --kv-cache-memory at least that" if asked_bytes is not None else
                   "use a smaller --block-size, or give --kv-cache-memory at least that (on a "
                   "GPU, a higher --gpu-memory-utilization also makes the cache larger)")
            raise InferlabError(f"a KV cache of {format_bytes(budget_bytes)} holds no block: one "
                                f"block of {block_size} tokens takes {block_bytes:,} bytes "
                                f"({format_bytes(block_bytes)}); {fix}")
        return cls(num_blocks, block_size, bytes_per_token)

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def fit_context(self, context: int, asked: int | None) -> int:
        """A context one request can fill in the pool. An `asked` max_model_len past it is refused
        at start, as vLLM refuses it (else every long request would be refused for want of
        blocks); the model's own is lowered to it, so that what the server advertises
        (/v1/models) and the default max_tokens fit."""
        if context <= self.num_tokens:
            return context
        size = format_bytes(self.num_tokens * self.bytes_per_token)
        if asked is not None:
            raise InferlabError(
                f"max_model_len {context} does not fit in the KV cache: {size} holds "
                f"{self.num_tokens} tokens; raise --kv-cache-memory or lower --max-model-len")
        logger.warning("max_model_len lowered from %d to %d tokens, what the KV cache (%s) holds",
                       context, self.num_tokens, size)
        return self.num_tokens

    def describe(self, max_model_len: int) -> str:
        """Its size, and how many requests of the whole context it holds at once (vLLM's
        "maximum concurrency": the blocks over the blocks one such request takes)."""
        at_once = self.num_blocks / cdiv(max_model_len, self.block_size)
        size = format_bytes(self.num_tokens * self.bytes_per_token)
        return (f"KV cache: {self.num_blocks:,} blocks of {self.block_size} tokens "
                f"({self.num_tokens:,} tokens, {size}): {at_once:.1f} requests of "
                f"{max_model_len:,} tokens at once")
