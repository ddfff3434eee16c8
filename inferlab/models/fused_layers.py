"""The fused linear layers of the Llama family and the checkpoint shards they stack.

Pure Python (no torch), so that the planner can count the shards' sizes too.
"""

from __future__ import annotations

from inferlab.models.config import ModelConfig

# fused module name -> the checkpoint modules it stacks, in output-row order
FUSED_SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def shard_rows(config: ModelConfig, fused_name: str) -> list[int]:
    """Output rows of each shard of fused module `fused_name`, in FUSED_SHARDS' order: k and v
    have num_kv_heads × head_dim rows each (fewer than q under GQA)."""
    if fused_name == "qkv_proj":
        return [config.q_size, config.kv_size, config.kv_size]
    if fused_name == "gate_up_proj":
        return [config.intermediate_size, config.intermediate_size]
    raise KeyError(f"{fused_name!r} is not a fused layer (those are {', '.join(FUSED_SHARDS)})")
