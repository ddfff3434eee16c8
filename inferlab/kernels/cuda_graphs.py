"""CUDA graphs for decode steps: capture once per padded batch size, then replay.

A decode step of a small batch launches hundreds of tiny kernels; on a GPU the launches, not the
math, set its speed. A CUDA graph records the whole step once and replays it with one launch.
A graph replays fixed shapes at fixed addresses, so:
- the step reads its inputs from static buffers owned here, sized for the largest batch;
- a batch of B sequences runs the graph captured for the smallest capture size >= B, the rows
  past B filled with harmless padding (slot -1 writes nothing, a padded sequence attends to one
  position of block 0) and their outputs dropped;
- everything the step touches besides its inputs (weights, KV cache) must keep its address.

The step is any callable `step(inputs) -> Tensor` whose inputs are batch-major tensors
[B, ...] (token ids, positions, slot mapping, seq lens, block tables...). Whatever does not
depend on the batch contents (for decode, query_start_loc = arange(B + 1)) the step builds
itself from B. DecodeGraphs keeps the step, so the step must not refer back to what owns the
DecodeGraphs (a bound method of the owner would): LLMEngine gc.freeze()s, which leaves reference
counting alone to free a dropped engine, and such a cycle would keep its memory to the end.
On CPU (or with graphs disabled) `run` still goes through the static buffers and padding,
eagerly, which is what the CPU tests exercise.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from inferlab.errors import InferlabError

Step = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def default_capture_sizes(max_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 8 up to max_batch_size (which is always included)."""
    sizes = [s for s in (1, 2, 4) if s < max_batch_size]
    sizes += list(range(8, max_batch_size, 8)) + [max_batch_size]
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True)
class CudaGraphConfig:
    max_batch_size: int = 256  # the largest decode batch replayed from a graph
    capture_sizes: tuple[int, ...] = ()  # empty: default_capture_sizes(max_batch_size)
    warmup_runs: int = 2  # eager runs before each capture (compiles Triton kernels, warms allocator)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise InferlabError(f"CUDA graphs: max batch size must be >= 1, got {self.max_batch_size}")
        if any(s < 1 or s > self.max_batch_size for s in self.capture_sizes):
            raise InferlabError(f"CUDA graphs: capture sizes must lie in 1..{self.max_batch_size}, "
                                f"got {list(self.capture_sizes)}")
        if self.warmup_runs < 1:
            raise InferlabError("CUDA graphs: need at least one warm-up run before capture")

    def sizes(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.capture_sizes))) or default_capture_sizes(self.max_batch_size)


def padded_batch_size(batch_size: int, sizes: tuple[int, ...]) -> int | None:
    """The smallest capture size >= batch_size (sizes sorted), or None when none is big enough."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) else None


class DecodeGraphs:
    """Static input buffers plus one captured graph per capture size."""

    def __init__(self, step: Step, example_inputs: Mapping[str, torch.Tensor],
                 pad_values: Mapping[str, int | float], config: CudaGraphConfig,
                 use_graphs: bool | None = None) -> None:
        """example_inputs: one tensor per input, [max_batch_size, ...], fixing shape, dtype and
        device of its buffer; pad_values: what padded rows hold, per input."""
        if set(pad_values) != set(example_inputs):
            raise ValueError(f"pad_values must name every input: {sorted(example_inputs)}")
        for name, t in example_inputs.items():
            if t.shape[0] != config.max_batch_size:
                raise ValueError(f"input {name!r} has {t.shape[0]} rows, expected "
                                 f"max_batch_size={config.max_batch_size}")
        self.step, self.config, self.sizes = step, config, config.sizes()
        self.pad_values = dict(pad_values)
        self.buffers = {name: t.clone() for name, t in example_inputs.items()}
        device = next(iter(self.buffers.values())).device
        self.use_graphs = device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and device.type != "cuda":
            raise InferlabError("CUDA graphs need the inputs on a CUDA device")
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _inputs(self, size: int) -> dict[str, torch.Tensor]:
        return {name: buf[:size] for name, buf in self.buffers.items()}

    def _fill(self, inputs: Mapping[str, torch.Tensor], size: int) -> None:
        """Copy a batch into the buffers' leading rows and columns; pad rows up to `size`."""
        n = next(iter(inputs.values())).shape[0]
        for name, buf in self.buffers.items():
            src = inputs[name]
            if src.shape[0] != n or src.dim() != buf.dim():
                raise ValueError(f"input {name!r} has shape {tuple(src.shape)}; expected {n} "
                                 f"rows and {buf.dim()} dims")
            buf[tuple(slice(0, d) for d in src.shape)].copy_(src, non_blocking=True)
            buf[n:size].fill_(self.pad_values[name])

    def capture(self) -> None:
        """Record one graph per capture size, largest first so smaller ones reuse its memory."""
        if not self.use_graphs:
            return
        pool = torch.cuda.graph_pool_handle()
        for size in sorted(self.sizes, reverse=True):
            for name, buf in self.buffers.items():  # every row padding: valid, harmless inputs
                buf[:size].fill_(self.pad_values[name])
            inputs = self._inputs(size)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.config.warmup_runs):
                    self.step(inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.step(inputs)
            self.graphs[size] = (graph, out)
        torch.cuda.synchronize()

    def run(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Run one decode step; returns [B, ...] (a view of a static buffer when replayed: use it
        before the next call). Batches above every capture size run eagerly, unpadded."""
        n = next(iter(inputs.values())).shape[0]
        size = padded_batch_size(n, self.sizes)
        if size is None:
            return self.step(dict(inputs))
        self._fill(inputs, size)
        if size in self.graphs:
            graph, out = self.graphs[size]
            graph.replay()
        else:
            out = self.step(self._inputs(size))
        return out[:n]
