"""Decode-only steps through CUDA graphs: the model's forward for B single-token sequences,
replayed from the graph captured for the next capture size (kernels/cuda_graphs.py).

Only the forward is captured: the logits are computed afterwards for the real rows, so each
captured size keeps a [size, hidden] output, not a [size, vocab] one. On CPU the same buffers
and padding run eagerly (what the CPU tests check); the engine uses this path on CUDA only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from inferlab.engine.outputs import ScheduledChunk, flat_batch
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.cuda_graphs import CudaGraphConfig, DecodeGraphs, padded_batch_size
from inferlab.models.llama import KVCache, LlamaForCausalLM

# What a padded row holds: token 0 at position 0, attending to one position of block 0, and
# writing nothing (slot -1).
_PADDING = {"ids": 0, "positions": 0, "slots": -1, "seq_lens": 1, "tables": 0}


def fits_graph(chunks: Sequence[ScheduledChunk]) -> bool:
    """A step the graphs can run: every chunk one new token that samples, and its drafts (each a
    decode row), and nobody asking for prompt logprobs (their rows are read from the hidden
    states the graph does not return)."""
    return bool(chunks) and all(
        c.num_new_tokens == 1 + len(c.spec_token_ids) and c.samples
        and c.request.sampling_params.prompt_logprobs is None for c in chunks)


class DecodeForward:
    """The step the graphs capture: the model's forward for B single-token sequences.

    Its own object, not a method of GraphedDecode: DecodeGraphs keeps its step, and a bound
    method would make GraphedDecode -> DecodeGraphs -> GraphedDecode a cycle. LLMEngine
    gc.freeze()s what exists once it is built, so only reference counting ever frees a dropped
    engine, and a cycle would keep its KV cache and the graphs' memory to the process's end."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], block_size: int,
                 max_batch_size: int, max_seq_len: int, device: torch.device) -> None:
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.max_seq_len = max_seq_len
        self._starts = torch.arange(max_batch_size + 1, dtype=torch.int32, device=device)

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """inputs [B] / [B, W] -> final hidden states [B, hidden]."""
        b = inputs["ids"].shape[0]
        # Host lengths are not known inside a graph: max_seq_len bounds them (only the torch
        # path reads them, to size its gather; the mask comes from the device seq_lens).
        meta = AttentionMetadata(self._starts[:b + 1], inputs["seq_lens"], inputs["tables"],
                                 inputs["slots"], [1] * b, [self.max_seq_len] * b, self.block_size)
        return self.model(inputs["ids"], inputs["positions"], self.kv_caches, meta)


class GraphedDecode:
    def __init__(self, model: LlamaForCausalLM, kv_caches: list[KVCache], block_size: int,
                 max_batch_size: int, max_blocks_per_seq: int, device: torch.device) -> None:
        self.block_size = block_size
        rows = max_batch_size
        example = {
            "ids": torch.zeros(rows, dtype=torch.int64, device=device),
            "positions": torch.zeros(rows, dtype=torch.int64, device=device),
            "slots": torch.zeros(rows, dtype=torch.int64, device=device),
            "seq_lens": torch.ones(rows, dtype=torch.int32, device=device),
            "tables": torch.zeros(rows, max_blocks_per_seq, dtype=torch.int32, device=device),
        }
        step = DecodeForward(model, kv_caches, block_size, max_batch_size,
                             max_blocks_per_seq * block_size, device)
        self.graphs = DecodeGraphs(step, example, _PADDING,
                                   CudaGraphConfig(max_batch_size=max_batch_size))

    def capture(self) -> None:
        """Record the graphs (CUDA only; a no-op on CPU). Warm-up runs write nothing to the cache:
        every row is padding."""
        with torch.inference_mode():
            self.graphs.capture()

    def covers(self, batch_size: int) -> bool:
        return padded_batch_size(batch_size, self.graphs.sizes) is not None

    def run(self, chunks: list[ScheduledChunk], device: torch.device) -> torch.Tensor:
        """One decode step -> final hidden states [R, hidden] of the chunks' new tokens and
        drafts, a row each."""
        input_ids, positions, meta = flat_batch(chunks, self.block_size)  # host tensors,
        host = {"ids": input_ids, "positions": positions, "slots": meta.slot_mapping,  # copied into
                "seq_lens": meta.seq_lens, "tables": meta.block_tables}  # the buffers
        return self.graphs.run({name: t.to(device, non_blocking=True) for name, t in host.items()})
