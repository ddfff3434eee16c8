"""SchedulerOutput -> one flat batch (ids, positions, slots, block tables) -> sampled tokens."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from inferlab.engine.bad_words import barred_now
from inferlab.engine.block_manager import cdiv
from inferlab.engine.graphed_decode import GraphedDecode, fits_graph
from inferlab.engine.outputs import (
    ModelRunnerOutput,
    ScheduledChunk,
    SchedulerOutput,
    TokenLogprobs,
    flat_batch,
)
from inferlab.engine.request import Guide, Request
from inferlab.engine.sampler import SamplingBatch, gather_logprobs, sample
from inferlab.engine.seeded_draws import SeededUniforms
from inferlab.engine.spec_decode import accepted_tokens
from inferlab.errors import GuidedDecodingError
from inferlab.kernels.host_memory import commit_pages, zeroed
from inferlab.models.llama import KVCache, LlamaForCausalLM

logger = logging.getLogger("inferlab.engine")


@dataclass(frozen=True)
class RunnerConfig:
    num_blocks: int
    block_size: int
    kv_dtype: torch.dtype
    device: torch.device
    seed: int = 0
    # Decode-only steps of up to this many sequences replay CUDA graphs (0: always eager).
    # max_model_len sets the graphs' block-table width.
    max_graph_batch_size: int = 0
    max_model_len: int = 0

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(f"a KV cache of {self.num_blocks} blocks of {self.block_size} tokens")
        if self.max_graph_batch_size < 0 or (self.max_graph_batch_size and self.max_model_len < 1):
            raise ValueError(f"CUDA graphs of up to {self.max_graph_batch_size} sequences need a "
                             f"max_model_len for their block tables, got {self.max_model_len}")


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: RunnerConfig) -> None:
        self.model = model
        self.config = config
        cfg = model.config
        shape = (config.num_blocks, config.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: list[KVCache] = [
            (zeroed(shape, config.kv_dtype, config.device), zeroed(shape, config.kv_dtype, config.device))
            for _ in range(cfg.num_layers)
        ]
        for pair in self.kv_caches:
            for cache in pair:
                commit_pages(cache)
        self.seeded_uniforms = SeededUniforms()
        torch.manual_seed(config.seed)
        self.graphed: GraphedDecode | None = None
        if config.max_graph_batch_size:
            self.graphed = GraphedDecode(model, self.kv_caches, config.block_size,
                                         config.max_graph_batch_size,
                                         cdiv(config.max_model_len, config.block_size), config.device)
            self.graphed.capture()

    def forget(self, finished_request_ids: Iterable[str]) -> None:
        """Drop what the runner keeps for requests that finished (their seeded draws), every
        step, whether or not it computes anything."""
        for request_id in finished_request_ids:
            self.seeded_uniforms.forget(request_id)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        chunks = sched.chunks
        if (self.graphed is not None and fits_graph(chunks)
                and self.graphed.covers(sum(c.num_new_tokens for c in chunks))):
            # every row samples: each chunk's new token, then its drafts
            return self._sample(chunks, list(range(len(chunks))), self.graphed.run(chunks, self.config.device))
        device = self.config.device
        input_ids, positions, meta = flat_batch(chunks, self.config.block_size, device)
        hidden = self.model(input_ids.to(device), positions.to(device), self.kv_caches, meta)  # [N, hidden]
        ends = list(itertools.accumulate(c.num_new_tokens for c in chunks))  # each chunk's rows end
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        output = self._sample(chunks, sampling, _sampled_rows(hidden, chunks, ends, sampling))
        self._prompt_logprobs(chunks, hidden, ends, output)
        return output

    def _sample(self, chunks: list[ScheduledChunk], sampling: list[int], hidden: torch.Tensor) -> ModelRunnerOutput:
        """hidden [S, hidden]: the rows of chunks[sampling] that sample, each chunk's newest token
        and its drafts -> the tokens each chunk outputs."""
        output = ModelRunnerOutput(sampled_token_ids={})
        if not sampling:
            return output
        logits = self.model.compute_logits(hidden)  # [S, V]
        picked = [chunks[i] for i in sampling]
        dead_ends: dict[str, int] = {}
        tokens, logprobs = sample(logits, self._sampling_batch(picked, output.failed, dead_ends))
        tokens_l = tokens.tolist()
        row = 0
        for c in picked:
            drafts, rid = c.spec_token_ids, c.request.request_id
            # at a dead end the output stops before its row, as without drafts; the next
            # step's first row is that dead end, and fails the request there
            taken = accepted_tokens(drafts, tokens_l[row:row + len(drafts) + 1])[:dead_ends.get(rid)]
            output.sampled_token_ids[rid] = taken
            if logprobs[row] is not None:
                output.logprobs[rid] = logprobs[row:row + len(taken)]
            self.seeded_uniforms.consumed(rid, len(taken))
            row += len(drafts) + 1
        return output

    def _sampling_batch(self, chunks: list[ScheduledChunk], failed: dict[str, str],
                        dead_ends: dict[str, int]) -> SamplingBatch:
        """One row per sampled position: a chunk's newest token, then each of its drafts, which
        sees the output as if the drafts before it were kept. A request whose guide fails is
        put in `failed` (request id -> why), or, where only kept drafts would lead there, in
        `dead_ends` (request id -> the first row past it)."""
        params, uniforms, prompts, outputs, barred, allowed = [], [], [], [], [], []
        for c in chunks:
            request, guide = c.request, c.request.guide
            uniforms += self.seeded_uniforms.take(request, len(c.spec_token_ids) + 1, self.config.device)
            for j in range(len(c.spec_token_ids) + 1):
                drafts = c.spec_token_ids[:j]
                output = request.output_token_ids + drafts if j else request.output_token_ids
                params.append(request.sampling_params)
                prompts.append(request.prompt_token_ids)
                outputs.append(output)
                barred.append(barred_now(request, output))
                allowed.append(None if guide is None else
                               _guide_allows(guide, request, drafts, failed, dead_ends))
        return SamplingBatch(params, uniforms, prompts, outputs, barred, allowed)

    def _prompt_logprobs(self, chunks: list[ScheduledChunk], hidden: torch.Tensor, ends: list[int],
                         output: ModelRunnerOutput) -> None:
        """Logprob of each prompt token given the ones before it, for requests that ask."""
        if all(c.request.sampling_params.prompt_logprobs is None for c in chunks):
            return
        starts = [end - c.num_new_tokens for c, end in zip(chunks, ends, strict=True)]
        for i, c in enumerate(chunks):
            request = c.request
            top_n = request.sampling_params.prompt_logprobs
            first = c.num_computed_tokens
            if top_n is None or first >= request.num_prompt_tokens:
                continue
            # rows of this chunk that predict a prompt token (positions first..P-2)
            last = min(first + c.num_new_tokens, request.num_prompt_tokens - 1)
            entries: list[TokenLogprobs | None] = [None] if first == 0 else []
            if last > first:
                rows = hidden[starts[i]:starts[i] + last - first]
                logprobs = torch.log_softmax(self.model.compute_logits(rows), dim=-1)
                targets = torch.tensor(request.prompt_token_ids[first + 1:last + 1], device=rows.device)
                entries += gather_logprobs(logprobs, targets, [top_n] * len(targets))
            output.prompt_logprobs[request.request_id] = (0 if first == 0 else first + 1, entries)


def _sampled_rows(hidden: torch.Tensor, chunks: list[ScheduledChunk], ends: list[int], sampling: list[int]) -> torch.Tensor:
    """hidden [N, hidden] -> the rows of chunks[sampling] that sample: each one's newest token
    and drafts, its last 1 + len(drafts) rows [S, hidden]; ends: where each chunk's rows end."""
    if len(sampling) == len(hidden):  # one token a chunk, all sampling: the rows as they are
        return hidden  # (four tensor ops saved, ~50 us of a ~6 ms single-stream step)
    rows = [r for i in sampling for r in range(ends[i] - len(chunks[i].spec_token_ids) - 1, ends[i])]
    return hidden[torch.tensor(rows, device=hidden.device)] if rows else hidden[:0]


def _guide_allows(guide: Guide, request: Request, drafts: list[int], failed: dict[str, str],
                  dead_ends: dict[str, int]) -> list[int] | torch.Tensor:
    """What the guide lets the request sample next. A guide that raises (a grammar too ambiguous
    to follow, or a bug) fails its own request, not the step and every request in it: the
    request goes into `failed`, and its row samples token 0, which the engine drops. After
    drafts it goes into `dead_ends`: the output stops before the row if the target keeps the
    drafts, and the next step fails the request there (rejected, they lead nowhere)."""
    try:
        return guide.allowed_now(request.output_token_ids, drafts)
    except GuidedDecodingError as e:
        if drafts:
            dead_ends.setdefault(request.request_id, len(drafts))
            return [0]
        why = str(e)
    except Exception as e:  # a bug: logged, and still its request's alone
        logger.exception("guided decoding failed for request %s", request.request_id)
        why = f"guided decoding failed ({type(e).__name__}: {e})"
    failed.setdefault(request.request_id, why)
    return [0]
