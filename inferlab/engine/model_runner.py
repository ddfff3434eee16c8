"""SchedulerOutput -> one flat batch (ids, positions, slots, block tables) -> sampled tokens."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from inferlab.engine.graphed_decode import GraphedDecode, fits_graph
from inferlab.engine.outputs import ModelRunnerOutput, SchedulerOutput, TokenLogprobs
from inferlab.engine.request import Request
from inferlab.engine.sampler import SamplingBatch, gather_logprobs, sample
from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions
from inferlab.models.llama import KVCache, LlamaForCausalLM


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


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: RunnerConfig) -> None:
        self.model = model
        self.config = config
        cfg = model.config
        shape = (config.num_blocks, config.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: list[KVCache] = [
            (torch.zeros(shape, dtype=config.kv_dtype, device=config.device),
             torch.zeros(shape, dtype=config.kv_dtype, device=config.device))
            for _ in range(cfg.num_layers)
        ]
        self.generators: dict[str, torch.Generator] = {}
        torch.manual_seed(config.seed)
        self.graphed: GraphedDecode | None = None
        if config.max_graph_batch_size:
            self.graphed = GraphedDecode(model, self.kv_caches, config.block_size,
                                         config.max_graph_batch_size,
                                         -(-config.max_model_len // config.block_size), config.device)
            self.graphed.capture()

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        for request_id in sched.finished_request_ids:
            self.generators.pop(request_id, None)
        chunks = sched.chunks
        if self.graphed is not None and fits_graph(chunks) and self.graphed.covers(len(chunks)):
            # every chunk samples, and row b of the graph's output is chunk b's token
            return self._sample(chunks, list(range(len(chunks))), self.graphed.run(chunks, self.config.device))
        query_lens = [c.num_new_tokens for c in chunks]
        seq_lens = [c.num_computed_tokens + c.num_new_tokens for c in chunks]
        input_ids = list(itertools.chain.from_iterable(  # list slices joined in C, not per token
            c.request.all_token_ids[c.num_computed_tokens:c.num_computed_tokens + c.num_new_tokens]
            for c in chunks))
        device = self.config.device
        meta = AttentionMetadata.build(query_lens, seq_lens, [c.request.block_ids for c in chunks],
                                       self.config.block_size, device)
        _, positions = token_positions(query_lens, seq_lens)
        hidden = self.model(torch.tensor(input_ids, device=device), positions.to(device),
                            self.kv_caches, meta)  # [N, hidden]
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        output = self._sample(chunks, sampling, self._sampled_rows(hidden, meta, sampling))
        self._prompt_logprobs(chunks, hidden, meta, output)
        return output

    @staticmethod
    def _sampled_rows(hidden: torch.Tensor, meta: AttentionMetadata, sampling: list[int]) -> torch.Tensor:
        """hidden [N, hidden] -> the last new token's row of each sampling chunk [S, hidden]."""
        if len(sampling) == len(hidden):  # one token a chunk, all sampling: the rows as they are
            return hidden  # (four tensor ops saved, ~50 us of a ~6 ms single-stream step)
        ends = meta.query_start_loc[1:].long() - 1  # last new token of each chunk
        return hidden[ends[sampling]] if sampling else hidden[:0]

    def _sample(self, chunks, sampling: list[int], hidden: torch.Tensor) -> ModelRunnerOutput:
        """hidden [S, hidden]: the last new token of chunks[sampling[s]] -> sampled tokens."""
        output = ModelRunnerOutput(sampled_token_ids={})
        if not sampling:
            return output
        logits = self.model.compute_logits(hidden)  # [S, V]
        tokens, logprobs = sample(logits, self._sampling_batch([chunks[i] for i in sampling]))
        for i, token, lp in zip(sampling, tokens.tolist(), logprobs, strict=True):
            rid = chunks[i].request.request_id
            output.sampled_token_ids[rid] = token
            if lp is not None:
                output.logprobs[rid] = lp
        return output

    def _sampling_batch(self, chunks) -> SamplingBatch:
        generators = []
        for c in chunks:
            request, seed = c.request, c.request.sampling_params.seed
            if seed is not None and request.request_id not in self.generators:
                self.generators[request.request_id] = torch.Generator(self.config.device).manual_seed(seed)
            generators.append(self.generators.get(request.request_id))
        return SamplingBatch(
            params=[c.request.sampling_params for c in chunks],
            generators=generators,
            prompt_ids=[c.request.prompt_token_ids for c in chunks],
            output_ids=[c.request.output_token_ids for c in chunks],
            suppressed_ids=[_barred_now(c.request) for c in chunks],
            allowed_ids=[c.request.guide.allowed_now(c.request.output_token_ids)
                         if c.request.guide is not None else None for c in chunks],
        )

    def _prompt_logprobs(self, chunks, hidden: torch.Tensor, meta: AttentionMetadata,
                         output: ModelRunnerOutput) -> None:
        """Logprob of each prompt token given the ones before it, for requests that ask."""
        if all(c.request.sampling_params.prompt_logprobs is None for c in chunks):
            return  # the common step: no host copy of query_start_loc (a device sync on a GPU)
        starts = meta.query_start_loc.tolist()
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


def _barred_now(request: Request) -> list[int]:
    """Token ids the request may not sample this step: _not_yet_allowed's, and each bad word's
    last token when the output ends with the tokens before it (vLLM's bad_words)."""
    barred = _not_yet_allowed(request)  # a new list every call
    out = request.output_token_ids
    for ids in request.bad_words_token_ids:
        before = len(ids) - 1
        if before == 0 or (before <= len(out) and out[len(out) - before:] == ids[:-1]):
            barred.append(ids[-1])
    return barred


def _not_yet_allowed(request: Request) -> list[int]:
    """vLLM's min_tokens: until the request has that many output tokens, its stop token ids
    and EOS (unless ignored) cannot be sampled, rather than sampled and then ignored."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        return []
    ids = list(params.stop_token_ids or ())
    if not params.ignore_eos and request.eos_token_id is not None:
        ids.append(request.eos_token_id)
    return ids
