"""Turns requests updated by a step into RequestOutputs: text deltas, stop strings, n copies."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from inferlab.engine.detokenizer import IncrementalDetokenizer
from inferlab.engine.outputs import (
    CompletionOutput,
    ModelRunnerOutput,
    RequestMetrics,
    RequestOutput,
    TokenLogprobs,
)
from inferlab.engine.request import NO_TOKEN, Request, RequestStatus
from inferlab.engine.token_texts import DecodedTokens
from inferlab.models.tokenizer import TextTokenizer


@dataclass
class _Completion:
    request: Request
    detokenizer: IncrementalDetokenizer | None
    emitted_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Parent:
    """A caller's request: n completions (child requests) that share one prompt."""

    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    children: list[_Completion]
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    pending: set[int] = field(default_factory=set)  # children updated since the last output


class OutputProcessor:
    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.decoded_tokens = DecodedTokens(tokenizer)
        self.parents: dict[str, _Parent] = {}
        self.child_of: dict[str, tuple[_Parent, int]] = {}
        self.emitted_tokens = 0  # output tokens given out, after stop strings cut drafts

    def add(self, request_id: str, prompt: str | None, children: list[Request]) -> None:
        first = children[0]
        params = first.sampling_params
        parent = _Parent(request_id, prompt, first.prompt_token_ids, [],
                         [] if params.prompt_logprobs is not None else None)
        for index, child in enumerate(children):
            detok = (IncrementalDetokenizer(self.tokenizer, child.prompt_token_ids, params.stop,
                                            params.include_stop_str_in_output, params.skip_special_tokens)
                     if params.detokenize else None)
            parent.children.append(_Completion(child, detok, logprobs=[] if params.logprobs is not None else None))
            self.child_of[child.request_id] = (parent, index)
        self.parents[request_id] = parent

    def parent_id(self, child_id: str) -> str | None:
        """The request a running completion belongs to (None once it has finished)."""
        entry = self.child_of.get(child_id)
        return None if entry is None else entry[0].request_id

    def child_ids(self, request_id: str) -> list[str]:
        parent = self.parents.get(request_id)
        return [] if parent is None else [c.request.request_id for c in parent.children]

    def process(self, updated: list[Request], runner_output: ModelRunnerOutput,
                final_only: bool = False) -> tuple[list[RequestOutput], list[str]]:
        """Returns the outputs (only finished requests' with final_only: offline callers skip
        building one per request per step), and the child ids that hit a stop string (to finish
        in the scheduler)."""
        touched: dict[str, _Parent] = {}
        stopped: list[str] = []
        for rid, (start, entries) in runner_output.prompt_logprobs.items():
            parent, index = self.child_of[rid]
            if index == 0 and parent.prompt_logprobs is not None:
                self._give_texts(entries, parent.children[0].request)
                parent.prompt_logprobs[start:start + len(entries)] = entries
        for request in updated:
            parent, index = self.child_of[request.request_id]
            completion = parent.children[index]
            if completion.logprobs is not None and request.request_id in runner_output.logprobs:
                entries = runner_output.logprobs[request.request_id]
                self._give_texts(entries, request)
                completion.logprobs += entries
            if request.finished:
                completion.finish_reason = request.status.finish_reason
                completion.stop_reason = request.stop_reason
            parent.pending.add(index)
            touched[parent.request_id] = parent
        outputs = []
        for parent in touched.values():
            out = self._make_output(parent, stopped, final_only)
            if out is not None:
                outputs.append(out)
        return outputs, stopped

    def _give_texts(self, entries: Sequence[TokenLogprobs | None], request: Request) -> None:
        """Let the entries name their tokens' texts (vLLM's decoded_token), where the request is
        detokenized: vLLM's are None without a tokenizer to decode with."""
        if request.sampling_params.detokenize:
            for entry in entries:
                if entry is not None:
                    entry.texts = self.decoded_tokens

    def abort(self, request_id: str, error: str | None = None) -> RequestOutput | None:
        """Mark every unfinished completion aborted, or with `error` failed (finish reason
        "error"); returns the final output."""
        parent = self.parents.get(request_id)
        if parent is None:
            return None
        for index, completion in enumerate(parent.children):
            if completion.finish_reason is None:
                completion.finish_reason = "abort" if error is None else "error"
                parent.pending.add(index)
        output = self._make_output(parent, [])
        if output is not None:
            output.error = error
        return output

    def _make_output(self, parent: _Parent, stopped: list[str],
                     final_only: bool = False) -> RequestOutput | None:
        """Detokenize what is new (stop strings are found here) and, unless final_only and
        the request goes on, build its output."""
        deltas = {index: self._advance(parent.children[index], stopped) for index in sorted(parent.pending)}
        parent.pending.clear()
        finished = all(c.finish_reason is not None for c in parent.children)
        if final_only and not finished:
            return None
        metrics = _metrics(parent.children)
        # each completion's own timings; one alone has the request's (no second object a step)
        own = [metrics] if len(parent.children) == 1 else [_metrics([c]) for c in parent.children]
        completions = [self._completion_output(index, completion, deltas.get(index), own[index])
                       for index, completion in enumerate(parent.children)]
        if finished:
            self.parents.pop(parent.request_id, None)
            for c in parent.children:
                self.child_of.pop(c.request.request_id, None)
        first = parent.children[0].request
        return RequestOutput(
            request_id=parent.request_id, prompt=parent.prompt, prompt_token_ids=parent.prompt_ids,
            outputs=completions, finished=finished,
            num_cached_tokens=max(first.num_cached_tokens, 0),
            prompt_logprobs=parent.prompt_logprobs, metrics=metrics,
        )

    def _advance(self, completion: _Completion, stopped: list[str]) -> tuple[str, list[int], int]:
        """Detokenize new tokens; returns (text delta, token delta, logprob start index)."""
        request = completion.request
        new_ids = request.output_token_ids[completion.emitted_tokens:]
        start = completion.emitted_tokens
        if new_ids and new_ids[-1] == NO_TOKEN:
            new_ids = new_ids[:-1]
            self._end_without_token(completion, stopped)
        text = ""
        if completion.detokenizer is not None:
            text, hit, kept = self._detokenize(completion, new_ids)
            # a stop string completed by the token that also hit max_tokens (or a stop token)
            # still reports it, as vLLM does: the text is cut at it either way
            if hit is not None and completion.finish_reason != "abort":
                if completion.finish_reason is None:
                    request.finished_time = time.monotonic()  # the scheduler frees it right after
                    stopped.append(request.request_id)
                completion.finish_reason, completion.stop_reason = "stop", hit
                if kept < len(new_ids):  # drafts kept past the stop string's token
                    new_ids = new_ids[:kept]
                    request.truncate_output(start + kept)
                    if completion.logprobs is not None:
                        del completion.logprobs[start + kept:]
        completion.emitted_tokens = request.num_output_tokens
        self.emitted_tokens += len(new_ids)
        return text, new_ids, start

    @staticmethod
    def _end_without_token(completion: _Completion, stopped: list[str]) -> None:
        """The sampler found nothing left to sample (NO_TOKEN, the output's last): drop that
        position and end the request with "stop" (the constraints the client set left nothing
        to sample; a guide's dead end fails instead, LLMEngine._fail_guided). Set before
        detokenizing, so that the text held back (a partial stop string) is flushed."""
        request = completion.request
        request.truncate_output(request.num_output_tokens - 1)
        if completion.logprobs is not None:
            del completion.logprobs[request.num_output_tokens:]
        if completion.finish_reason is None:  # else max_tokens ended it too: already freed
            request.finished_time = time.monotonic()  # the scheduler frees it right after
            stopped.append(request.request_id)
        completion.finish_reason, completion.stop_reason = "stop", None

    @staticmethod
    def _detokenize(completion: _Completion, new_ids: list[int]) -> tuple[str, str | None, int]:
        """(text delta, the stop string hit or None, how many of new_ids the output keeps)."""
        request, detokenizer = completion.request, completion.detokenizer
        params = request.sampling_params
        start = completion.emitted_tokens
        shown = new_ids
        if (request.status is RequestStatus.FINISHED_STOPPED and new_ids
                and not params.include_stop_str_in_output):
            shown = new_ids[:-1]  # a stop token's text (EOS's too) is not output, as in vLLM
        # Several tokens at once (speculative drafts kept): stop strings are looked for after
        # each, so that the output ends at the token that completed one, as without drafts.
        pieces = [shown] if len(shown) <= 1 or not params.stop else [[t] for t in shown]
        text = ""
        for i, piece in enumerate(pieces):
            count = start + (len(new_ids) if len(pieces) == 1 else i + 1)
            last = i == len(pieces) - 1
            # vLLM's min_tokens: stop strings count once the output is longer than it
            delta, hit = detokenizer.add(piece, last and completion.finish_reason is not None,
                                         count > params.min_tokens)
            text += delta
            if hit is not None:
                return text, hit, count - start
        return text, None, len(new_ids)

    @staticmethod
    def _completion_output(index: int, c: _Completion, delta: tuple[str, list[int], int] | None,
                           metrics: RequestMetrics) -> CompletionOutput:
        text_delta, ids_delta, start = delta if delta else ("", [], c.emitted_tokens)
        return CompletionOutput(
            index=index,
            text=c.detokenizer.text if c.detokenizer else "",
            token_ids=list(c.request.output_token_ids),
            finish_reason=c.finish_reason, stop_reason=c.stop_reason,
            logprobs=None if c.logprobs is None else list(c.logprobs),  # as token_ids: this output's own
            text_delta=text_delta, token_ids_delta=ids_delta,
            logprobs_delta=None if c.logprobs is None else c.logprobs[start:], metrics=metrics,
        )


def _metrics(children: list[_Completion]) -> RequestMetrics:
    """The timings of these completions together (all of a request's, or one's alone)."""
    requests = [c.request for c in children]
    first = requests[0]

    def earliest(values: Iterable[float | None]) -> float | None:
        values = [v for v in values if v is not None]
        return min(values) if values else None

    def latest(values: Iterable[float | None]) -> float | None:
        values = [v for v in values if v is not None]
        return max(values) if values else None

    return RequestMetrics(
        arrival_time=first.arrival_time,
        queued_time=earliest(r.queued_time for r in requests),
        first_scheduled_time=earliest(r.first_scheduled_time for r in requests),
        first_token_time=earliest(r.first_token_time for r in requests),
        last_token_time=latest(r.last_token_time for r in requests),
        finished_time=latest(r.finished_time for r in requests)
        if all(c.finish_reason for c in children) else None,
        num_generation_tokens=sum(r.num_output_tokens for r in requests),
        longest_completion_tokens=max(r.num_output_tokens for r in requests),
        max_tokens=first.max_tokens,
    )
