"""The engine: add_request / step / abort; step() is schedule -> run -> postprocess."""

from __future__ import annotations

import atexit
import gc
import itertools
import logging
import time
from collections.abc import Sequence

import torch

from inferlab.config import CPU_KV_CACHE_BYTES, EngineConfig
from inferlab.engine.beam_search import BeamSearch, BeamSearchParams
from inferlab.engine.engine_counters import EngineCounters
from inferlab.engine.generation_defaults import GenerationDefaults
from inferlab.engine.kv_cache_config import CacheConfig, KVPool
from inferlab.engine.memory_profile import profile_device_memory, profile_query_lens
from inferlab.engine.model_runner import ModelRunner, RunnerConfig
from inferlab.engine.output_processor import OutputProcessor
from inferlab.engine.outputs import ModelRunnerOutput, RequestOutput, SchedulerOutput
from inferlab.engine.platform import (
    available_memory_bytes,
    keep_freed_memory,
    release_freed_memory,
    resolve_device,
    resolve_dtype,
)
from inferlab.engine.prompt_reader import PromptReader
from inferlab.engine.request import RequestStatus
from inferlab.engine.request_builder import RequestBuilder
from inferlab.engine.sampling_params import SamplingParams
from inferlab.engine.scheduler import Scheduler
from inferlab.engine.scheduler_config import SchedulerConfig
from inferlab.engine.spec_decode import SpecDecodeCounters, SpeculativeConfig, propose_ngram
from inferlab.errors import InferlabError
from inferlab.kernels.host_memory import return_freed_memory
from inferlab.kernels.linear_choice import use_engine_linears
from inferlab.models.loader import LoadedModel, load_model, read_model_config
from inferlab.models.model_path import resolve_model_path
from inferlab.planner.memory import kv_cache_bytes_per_token
from inferlab.planner.units import format_bytes

# Unfrozen at exit (see LLMEngine.__init__), so that extension modules which check for leaks at
# shutdown (triton's, which torch imports) see their objects collected.
atexit.register(gc.unfreeze)
logger = logging.getLogger("inferlab.engine")
MAX_GRAPH_BATCH_SIZE = 512  # larger decode batches run eagerly: launches no longer dominate


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.bind_threads()
        self.device = resolve_device(config.device)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.dtype = resolve_dtype(config.dtype, self.device)
        # what the model's config decides is refused before its weights load (up to minutes)
        self.model_config = loaded.config if loaded else read_model_config(resolve_model_path(config.model))
        self.max_model_len = self._context_length()
        self.kv_bytes_per_token = kv_cache_bytes_per_token(
            self.model_config.num_layers, self.model_config.num_kv_heads,
            self.model_config.head_dim, torch.tensor([], dtype=self.dtype).element_size())
        budget = self._fixed_kv_cache_budget_bytes()
        fixed_pool = None if budget is None else self._fit_kv_pool(budget)
        if fixed_pool is not None:
            self._check_kv_cache_fits(fixed_pool, after_weights=False)
        self.loaded = (loaded.checked_for(self.dtype, self.device) if loaded
                       else load_model(config.model, self.dtype, self.device, self._prepare_layer))
        use_engine_linears(self.loaded.model, self.device, self.dtype)  # the rest, and the head
        return_freed_memory()
        self.tokenizer = self.loaded.tokenizer
        self.generation = GenerationDefaults.resolve(self.loaded, config.generation_config)
        self.kv_pool = (fixed_pool if fixed_pool is not None
                        else self._fit_kv_pool(self._profiled_kv_cache_budget_bytes()))
        self._check_kv_cache_fits(self.kv_pool, after_weights=True)  # the weights took their share
        self.num_kv_blocks = self.kv_pool.num_blocks
        logger.info(self.kv_pool.describe(self.max_model_len))
        cache_config = CacheConfig(block_size=config.block_size, num_blocks=self.num_kv_blocks,
                                   enable_prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(max_model_len=self.max_model_len, max_num_seqs=config.max_num_seqs,
                            max_num_batched_tokens=config.step_token_budget(self.max_model_len),
                            enable_chunked_prefill=config.enable_chunked_prefill,
                            long_prefill_token_threshold=config.long_prefill_token_threshold,
                            policy=config.scheduling_policy),
            cache_config)
        graphs = self.device.type == "cuda" and not config.enforce_eager
        self.runner = ModelRunner(self.loaded.model, RunnerConfig(
            self.num_kv_blocks, config.block_size, self.dtype, self.device, config.seed,
            max_graph_batch_size=min(config.max_num_seqs, MAX_GRAPH_BATCH_SIZE) if graphs else 0,
            max_model_len=self.max_model_len))
        self.prompts = PromptReader(self.tokenizer, self.model_config.vocab_size, self.max_model_len)
        self.requests = RequestBuilder(self.prompts, self.generation, config.scheduling_policy)
        self.outputs = OutputProcessor(self.tokenizer)
        self.counters = EngineCounters()
        # every draft position listed from the start (at 0), as vLLM's per-position series are
        drafts = config.speculative_config.num_speculative_tokens if config.speculative_config else 0
        self.spec_counters = SpecDecodeCounters(accepted_per_position=[0] * drafts)
        self.last_step_tokens = 0  # tokens the last step computed (/metrics reads it)
        self._ids = itertools.count()
        # Frozen, what exists now (model, tokenizer, libraries) is skipped by the full collections a
        # step's allocations trigger (~10% of a decode step); refcounts still free a dropped engine
        # (no cycles). Collected first: frozen cyclic garbage (once a GGUF's mmap) is never freed.
        gc.collect()
        gc.freeze()
        if self.device.type == "cpu":
            release_freed_memory()  # the load's garbage, kept by keep_freed_memory's threshold

    # -- requests -------------------------------------------------------------------------------

    def _prepare_layer(self, layer: torch.nn.Module) -> None:
        """A decoder layer just loaded: its linears take the engine's kernels (and narrow) at
        once, and the weights they freed go back to the OS, so that the load holds one layer at
        the checkpoint's width, not all of them."""
        use_engine_linears(layer, self.device, self.dtype)
        return_freed_memory()

    def _context_length(self) -> int:
        """max_model_len, within what the model computes as itself (ModelConfig.max_context);
        asking for more is an error, as in vLLM."""
        cfg, asked = self.model_config, self.config.max_model_len
        limit = cfg.max_context
        if asked is not None and asked > limit:
            what = (f"{limit} positions" if limit == cfg.max_positions else
                    f"sliding window of {limit} tokens (attention here is never windowed)")
            raise InferlabError(f"max_model_len {asked} is over the model's {what}")
        if cfg.sliding_window and asked is None:
            logger.info("the model attends through a sliding window of %d tokens: the context is "
                        "capped there", cfg.sliding_window)
        return asked or limit

    def _fixed_kv_cache_budget_bytes(self) -> int | None:
        """--kv-cache-memory, else a CPU's default: known before the weights load. None on a
        GPU, whose budget is what profiling a step leaves once they are in."""
        if self.config.kv_cache_memory_bytes is not None:
            return self.config.kv_cache_memory_bytes
        return None if self.device.type == "cuda" else CPU_KV_CACHE_BYTES

    def _profiled_kv_cache_budget_bytes(self) -> int:
        config = self.config
        query_lens = profile_query_lens(config.step_token_budget(self.max_model_len), config.max_num_seqs,
                                        self.max_model_len)
        memory = profile_device_memory(self.loaded.model, query_lens, config.block_size,
                                       self.dtype, self.device)
        kv_bytes = memory.kv_cache_bytes(config.gpu_memory_utilization)
        logger.info("KV cache %s: %s x %.2f - %s weights and activations - %s other",
                    format_bytes(kv_bytes), format_bytes(memory.total_bytes),
                    config.gpu_memory_utilization, format_bytes(memory.peak_torch_bytes),
                    format_bytes(memory.non_torch_bytes))
        return kv_bytes

    def _fit_kv_pool(self, budget_bytes: int) -> KVPool:
        """The pool the budget buys, refused if it holds no block or less than an asked
        max_model_len; the model's own max_model_len is lowered to it."""
        pool = KVPool.from_budget(budget_bytes, self.config.block_size, self.kv_bytes_per_token,
                                  self.config.kv_cache_memory_bytes)
        self.max_model_len = pool.fit_context(self.max_model_len, self.config.max_model_len)
        return pool

    def _check_kv_cache_fits(self, pool: KVPool, after_weights: bool) -> None:
        """Refuse a cache the device cannot hold: on a host, zeroing it would end in the OOM
        killer (exit 137) rather than an error. Before the weights load, only a cache larger
        than all the free memory is known not to fit."""
        kv_cache_bytes = pool.num_tokens * pool.bytes_per_token
        available = available_memory_bytes(self.device)
        if available is not None and kv_cache_bytes > available:
            when = " after the weights" if after_weights else ""
            raise InferlabError(
                f"a KV cache of {format_bytes(kv_cache_bytes)} (--kv-cache-memory) does not fit in "
                f"the {format_bytes(available)} this {self.device.type} has available{when}; "
                "choose a smaller --kv-cache-memory")

    def tokenize_prompt(self, prompt: str | Sequence[int], truncating: bool = False,
                        add_special_tokens: bool = True) -> tuple[str | None, list[int]]:
        """(text or None, token ids), checked against the model (PromptReader.tokenize)."""
        return self.prompts.tokenize(prompt, truncating, add_special_tokens)

    def check_text_fits(self, num_chars: int) -> None:
        """Refuse a text too long for the context before encoding it (PromptReader's)."""
        self.prompts.check_text_fits(num_chars)

    def bind_threads(self) -> None:
        """Apply num_threads to the calling thread, the one that will run the steps. OpenMP
        keeps the team size per thread: a thread that never set it (the AsyncEngine's loop)
        starts every parallel region of the C kernels with one thread per core, whatever
        torch.set_num_threads did elsewhere."""
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams,
                    request_id: str | None = None, arrival_time: float | None = None,
                    prompt_text: str | None = None, priority: int = 0,
                    cap_max_tokens: bool = False) -> str:
        """Queue a request (n completions); raises InferlabError if it can never be served.
        prompt_text: the text that token ids given as the prompt were encoded from (with special
        tokens); priority: lower goes first, under the "priority" scheduling policy only;
        cap_max_tokens: max_tokens past the context end it there, as in vLLM's offline LLM."""
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        self.add_requests([(request_id, prompt, prompt_text)], params, arrival_time, priority,
                          cap_max_tokens)
        return request_id

    def add_requests(self, prompts: Sequence[tuple[str, str | Sequence[int], str | None]],
                     params: SamplingParams, arrival_time: float | None = None,
                     priority: int = 0, cap_max_tokens: bool = False) -> list[list[int]]:
        """Queue a request per (request id, prompt, prompt text) as add_request does, all or
        none: every one is checked before any is queued, so a request of many prompts refused
        for one of them leaves nothing running nor counted (vLLM checks them all first).
        Returns each prompt's token ids as its requests run them (truncate_prompt_tokens cut).
        arrival_time: when the caller got the request (AsyncEngine's, before encoding it); now
        if None, as for LLM, whose adds wait for no step."""
        self.requests.check_priority(priority)
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        ready = [(rid, *self.requests.build(rid, prompt, text, params, arrival, priority, cap_max_tokens))
                 for rid, prompt, text in prompts]
        self._check_ids_free([[request_id, *(c.request_id for c in children)]
                              for request_id, _, children in ready])
        for request_id, text, children in ready:
            for child in children:
                self.scheduler.add_request(child)
            self.outputs.add(request_id, text, children)
        return [children[0].prompt_token_ids for _, _, children in ready]

    def _check_ids_free(self, names: list[list[str]]) -> None:
        """Each request's id and its copies' ids are in use by no other request, queued or in
        the batch: a copy's id ("r#1") can be another request's own."""
        seen: set[str] = set()
        for request_names in names:
            for name in dict.fromkeys(request_names):  # with n = 1 the copy's id is the request's
                if name in seen or name in self.outputs.parents or name in self.outputs.child_of:
                    raise InferlabError(f"request id {name!r} is already in use")
                seen.add(name)

    def start_beam_search(self, prompt: str | Sequence[int],
                          params: BeamSearchParams) -> tuple[str | None, BeamSearch]:
        """(the prompt's text, as a request reads it, and a search over it) for LLM and AsyncEngine."""
        text, ids = self.prompts.read(prompt, None, params.truncate_prompt_tokens)
        return text, BeamSearch(ids, params, set(self.generation.end_token_ids), self.max_model_len)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Finish a request as aborted; its KV blocks are free when this returns."""
        children = self.outputs.child_ids(request_id)
        self.scheduler.finish_requests(children, RequestStatus.FINISHED_ABORTED)
        output = self.outputs.abort(request_id)
        if output is not None:  # copies that had ended count; the aborted ones do not
            self.counters.count_finished(output)
        return output

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # -- the loop -------------------------------------------------------------------------------

    def step(self, final_only: bool = False) -> list[RequestOutput]:
        """One scheduling step; returns an output per request it advanced, or with final_only
        (vLLM's FINAL_ONLY output kind) only for the requests it finished."""
        sched = self.scheduler.schedule()
        self.last_step_tokens = sched.total_num_scheduled_tokens
        # before an empty step returns: its finished ids are given once (an idle step once kept
        # a finished request's seeded draws, which its id, reused with the seed, then went on with)
        self.runner.forget(sched.finished_request_ids)
        if sched.is_empty:
            return []
        runner_output = self.runner.execute(sched)
        failed = self._fail_guided(runner_output)  # before their tokens are taken
        speculative = self.config.speculative_config
        if speculative is not None:  # before the scheduler cuts outputs at a stop
            self._count_drafts(sched, runner_output)
        updated = self.scheduler.update_from_output(sched, runner_output)
        self.counters.count_prefills(updated)
        emitted_before = self.outputs.emitted_tokens
        outputs, stopped = self.outputs.process(updated, runner_output, final_only)
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        self.counters.generation_tokens += self.outputs.emitted_tokens - emitted_before
        outputs += failed
        for out in outputs:
            if out.finished:
                self.counters.count_finished(out)
        if speculative is not None:
            self._propose_drafts(speculative)
        return outputs

    def _fail_guided(self, runner_output: ModelRunnerOutput) -> list[RequestOutput]:
        """End the requests whose guide failed this step, each copy of theirs (n > 1) with
        finish reason "error"; the step's tokens and logprobs for them are dropped (the
        scheduler skips finished requests, the draft counters would not)."""
        outputs = []
        for child_id, why in runner_output.failed.items():
            request_id = self.outputs.parent_id(child_id)
            if request_id is None:  # a sibling's failure ended it already
                continue
            children = self.outputs.child_ids(request_id)
            for child in children:
                for per_request in (runner_output.sampled_token_ids, runner_output.logprobs,
                                    runner_output.prompt_logprobs):
                    per_request.pop(child, None)
            self.scheduler.finish_requests(children, RequestStatus.FINISHED_ERROR)
            output = self.outputs.abort(request_id, error=why)
            if output is not None:
                outputs.append(output)
        return outputs

    def _propose_drafts(self, config: SpeculativeConfig) -> None:
        """Drafts for every running request whose next step is a decode: as many as the config
        allows at this batch size, never more than its max_tokens leaves room for after the
        token the step adds."""
        running = self.scheduler.running
        allowed = config.drafts_for(len(running))
        for request in running:
            request.spec_token_ids = []
            if allowed and request.num_computed_tokens == request.num_tokens - 1:
                room = request.max_tokens - request.num_output_tokens - 1
                request.spec_token_ids = propose_ngram(request.all_token_ids, config, min(allowed, room))

    def _count_drafts(self, sched: SchedulerOutput, runner_output: ModelRunnerOutput) -> None:
        for chunk in sched.chunks:
            tokens = runner_output.sampled_token_ids.get(chunk.request.request_id)
            if chunk.spec_token_ids and tokens is not None:
                self.spec_counters.record(len(chunk.spec_token_ids), len(tokens) - 1)

