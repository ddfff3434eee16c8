"""API request fields -> SamplingParams; its ValueErrors become 400s naming the field."""

from __future__ import annotations

from typing import Any

from inferlab.engine.beam_search import BeamSearchParams
from inferlab.engine.sampling_params import SamplingParams
from inferlab.server.errors import bad_request, parameter_error
from inferlab.server.guide_fields import guide_field_names, guide_params
from inferlab.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields


def completion_params(req: CompletionRequest, defaults: dict[str, Any]) -> SamplingParams:
    # the prompt's logprobs serve echo with logprobs and vLLM's prompt_logprobs: the larger top k
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    return _build(req, defaults, max_tokens=1 if echo_only(req) else req.max_tokens,
                  logprobs=req.logprobs, prompt_logprobs=max(asked) if asked else None)


def echo_only(req: CompletionRequest) -> bool:
    """OpenAI's max_tokens 0 with echo, how clients score a text's log-likelihood: the prompt
    and its logprobs come back and nothing else. The engine still samples one token (a request
    must), as vLLM's does, and the reply leaves it out."""
    return req.echo and req.max_tokens == 0


def chat_params(req: ChatCompletionRequest, defaults: dict[str, Any],
                tool_schema: dict[str, Any] | None = None,
                keep_special_tokens: bool = False) -> SamplingParams:
    """tool_schema: a forced tool call's guide; keep_special_tokens: the tool parser reads one."""
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    for_tools: dict[str, Any] = {} if tool_schema is None else {"json_schema": tool_schema}
    if keep_special_tokens:
        for_tools["skip_special_tokens"] = False
    # an error names the field the client set: top_logprobs is the engine's logprobs
    renamed = {"logprobs": "top_logprobs"}
    if tool_schema is not None:  # the forced tool call's guide
        renamed["json_schema"] = "tool_choice"
    if req.max_completion_tokens is not None:
        renamed["max_tokens"] = "max_completion_tokens"
    return _build(req, defaults, renamed, max_tokens=max_tokens, logprobs=logprobs, **for_tools)


def _build(req: SamplingFields, defaults: dict[str, Any], renamed: dict[str, str] | None = None,
           **fields: Any) -> SamplingParams:
    """defaults: the model's (generation_config.json) for the sampling fields a request leaves
    out; a max_tokens left out (None) is capped by the engine; renamed: for parameter_error."""
    # vLLM refuses any option given without stream, yet lets an empty {} by (falsy to its check)
    if req.stream_options is not None and req.stream_options.model_fields_set and not req.stream:
        raise bad_request("'stream_options' is only allowed with 'stream': true", "stream_options")
    given = {
        "n": req.n, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "min_p": req.min_p, "seed": req.seed, "stop": req.stop, "stop_token_ids": req.stop_token_ids,
        "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty, "ignore_eos": req.ignore_eos,
        "min_tokens": req.min_tokens, "logit_bias": _token_keys(req.logit_bias),
        "allowed_token_ids": req.allowed_token_ids, "truncate_prompt_tokens": req.truncate_prompt_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens, "bad_words": req.bad_words,
        "cache_salt": req.cache_salt, **guide_params(req), **fields,
    }
    for name, value in defaults.items():
        if given.get(name) is None and name != "max_tokens":
            given[name] = value
    # None means "the default" everywhere except max_tokens, where it means "to the context end"
    kwargs = {k: v for k, v in given.items() if v is not None or k == "max_tokens"}
    try:
        return SamplingParams(**kwargs)
    except ValueError as e:
        raise parameter_error(str(e), {**guide_field_names(req), **(renamed or {})}) from None


def _token_keys(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias keys are token ids written as JSON strings ("50256")."""
    if bias is None:
        return None
    for key in bias:
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
    return {int(key): value for key, value in bias.items()}


# what beam search does not hold to: set to anything but its default, it is refused by name
# (temperature is taken and has no effect, as in vLLM: beams rank by the model's own logprobs)
_NOT_FOR_BEAMS = ("seed", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids",
                  "bad_words", "min_tokens", "prompt_logprobs",
                  "guided_choice", "guided_json", "guided_regex", "guided_grammar",
                  "structured_outputs", "response_format", "include_stop_str_in_output")


def beam_search_params(req: SamplingFields, params: SamplingParams) -> BeamSearchParams | None:
    """vLLM's use_beam_search: the n best beams of params.max_tokens tokens; None without it."""
    if not req.use_beam_search:
        if req.length_penalty != 1.0:
            raise bad_request("'length_penalty' needs 'use_beam_search': true", "length_penalty")
        return None
    fields = type(req).model_fields
    for name in _NOT_FOR_BEAMS:
        value = getattr(req, name, None)
        if name in fields and value is not None and value != fields[name].default and value != {
                "type": "text"} and not (name == "seed" and value == -1):  # -1: no seed (vLLM)
            raise bad_request(f"beam search does not take '{name}'", name)
    if getattr(req, "echo", False) and params.prompt_logprobs is not None:  # vLLM asserts here
        raise bad_request("beam search does not take 'echo' with 'logprobs': the prompt's "
                          "logprobs are not computed", "echo")
    try:
        return BeamSearchParams(beam_width=params.n, max_tokens=params.max_tokens,
                                ignore_eos=params.ignore_eos, length_penalty=req.length_penalty,
                                logprobs=params.logprobs,
                                truncate_prompt_tokens=params.truncate_prompt_tokens,
                                cache_salt=params.cache_salt,
                                skip_special_tokens=params.skip_special_tokens)
    except ValueError as e:  # named as the request sets it: n is the beam width
        raise parameter_error(str(e), {"beam_width": "n"}) from None
