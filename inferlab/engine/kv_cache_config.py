"""How the paged KV cache is laid out: block size, pool size, prefix caching."""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.errors import InferlabError


@dataclass(frozen=True)
class CacheConfig:
    """The KV block pool the block manager hands out.

    `num_blocks=None` means "size the pool from free memory": the engine computes the
    count with `inferlab.planner.memory.num_kv_blocks` and builds a resolved copy with
    `dataclasses.replace(config, num_blocks=n)`; the block manager needs a resolved one.
    """

    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # KV blocks in the pool; None until the engine sizes it
    enable_prefix_caching: bool = True  # reuse full blocks of earlier requests by chained hash

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InferlabError(f"block_size must be a power of two, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise InferlabError(
                f"the KV cache needs at least one block, got num_blocks={self.num_blocks}")
