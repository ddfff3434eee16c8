"""The OpenAI API's request and response bodies, as pydantic models.

Requests are validated strictly (a string where a number belongs is a 400, not a silent cast);
unknown fields are ignored as vLLM ignores them, except the ones listed in `unsupported.py`,
which would change the answer and so are refused by name.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    # Fields that OpenAI's API reference lists as "or null" and vLLM declares Optional with a
    # default: an explicit null means the default. (A field typed `X | None` takes null as a
    # value of its own and is not listed.)
    null_means_default: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _drop_default_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not cls.null_means_default:
            return data
        return {k: v for k, v in data.items() if v is not None or k not in cls.null_means_default}


class StreamOptions(_Request):
    """vLLM's: given at all, stream_options asks for the usage chunk unless include_usage says
    otherwise; an explicit null include_usage is None, which asks for none."""

    include_usage: bool | None = True  # a last chunk with no choices and the request's usage
    # usage so far in every chunk (vLLM's extension), only alongside include_usage
    continuous_usage_stats: bool | None = False


def usage_asked(options: StreamOptions | None) -> tuple[bool, bool]:
    """(a last chunk with the usage, the usage so far in every chunk), as vLLM reads them."""
    final = options is not None and bool(options.include_usage)
    return final, final and bool(options.continuous_usage_stats)


class SamplingFields(_Request):
    """What completions and chat share; None means the default."""

    null_means_default = frozenset({"n", "stream", "return_tokens_as_token_ids",
                                    "return_token_ids"})
    model: str | None = None
    n: int = Field(1, le=128)  # OpenAI's cap; each copy is a sequence in the engine
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (a JSON key, so a string) -> bias
    # vLLM's extensions
    allowed_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    bad_words: list[str] | None = None
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:<id>"
    return_token_ids: bool = False  # the prompt's and the output's token ids beside the text
    cache_salt: str | None = None
    priority: int = 0  # lower first, with --scheduling-policy priority
    guided_choice: list[str] | None = None  # the output is one of these strings
    guided_json: dict[str, Any] | bool | str | None = None  # a JSON schema (or its text)
    guided_regex: str | None = None  # the whole output matches this pattern
    guided_grammar: str | None = None  # the output is a whole root of this EBNF (GBNF) grammar
    # vLLM's newer form: {"choice": [...]}, {"json": schema}, {"regex": pattern} or
    # {"json_object": true}
    structured_outputs: dict[str, Any] | None = None
    # OpenAI's: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
    # {"name": ..., "schema": {...}}}
    response_format: dict[str, Any] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    use_beam_search: bool = False  # vLLM's: the n best beams (n is the beam width), no sampling
    length_penalty: float = 1.0  # beam search: a beam's score is logprob / length ** this
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(SamplingFields):
    null_means_default = SamplingFields.null_means_default | {"echo"}
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None  # the chosen token's logprob and the top k
    echo: bool = False  # the prompt before the completion (with prompt logprobs if asked)
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and the top k
    add_special_tokens: bool = True  # vLLM's: False, no BOS is added to a text prompt


class ContentPart(_Request):
    # optional here so that a part without one is refused by chat_prompt, saying so, rather than
    # as an invalid string (the other side of content's union)
    type: str | None = None
    text: str | None = None
    refusal: str | None = None  # an assistant's {"type": "refusal"} part


class FunctionCall(_Request):
    name: str
    arguments: str  # the arguments' JSON text


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: str
    # a bare string among the parts is a text part, as vLLM reads it
    content: str | list[ContentPart | str] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    reasoning_content: str | None = None  # an assistant's earlier thinking (vLLM's two names)
    reasoning: str | None = None


class FunctionDefinition(_Request):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # a forced call is always held to the schema; auto never is


class ToolDefinition(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(SamplingFields):
    null_means_default = SamplingFields.null_means_default | {"logprobs"}
    messages: list[ChatMessage]
    max_tokens: int | None = None  # None: up to the context length
    max_completion_tokens: int | None = None  # the newer name; wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # False: the template's prompt without the assistant's turn
    continue_final_message: bool = False  # the model goes on with the last message (a prefill)
    echo: bool = False  # vLLM's: the reply starts with the last message when it is in the reply's role
    add_special_tokens: bool = False  # vLLM's: True adds a BOS before what the template wrote
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the template
    tools: list[ToolDefinition] | None = None
    tool_choice: str | dict[str, Any] | None = None  # None: "auto" with tools, else "none"
    parallel_tool_calls: bool | None = None  # False: at most one call with "required"
    include_reasoning: bool = True  # vLLM's: False leaves the thinking out of the reply


class TokenizeRequest(_Request):
    null_means_default = frozenset({"return_token_strs"})
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDefinition] | None = None  # given to the chat template, as chat gives them
    return_token_strs: bool = False  # each token's own string (its vocabulary entry) too


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


# -- responses ------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served by the prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # OpenAI's cached-token count


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    logprob: float
    rank: int
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    # vLLM's shape: per prompt token (None for the first), token id -> its logprob and rank, for
    # the token itself and the top k; in a stream, in each choice's first chunk
    prompt_logprobs: list[dict[int, PromptLogprob] | None] | None = None
    # return_token_ids: the prompt's (in a stream, in each choice's first chunk) and the
    # output's (in a stream, each chunk's new ones)
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class Completion(BaseModel):
    """A completion, or one chunk of a streamed one (same shape, usage usually None)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None  # OpenAI's; null, as vLLM's: no backend fingerprint


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ReplyMessage(BaseModel):
    # vLLM's: the assistant's, or with add_generation_prompt false the last message's (the turn
    # the reply goes on with)
    role: str
    content: str | None  # None: the reply is tool calls only, or thinking only
    refusal: str | None = None  # OpenAI requires it (null: no refusal), as vLLM sends; deltas have none
    # the thinking, with --reasoning-parser: vLLM's name since 0.11 and its first (DeepSeek's),
    # which it has since dropped and clients written for it still read
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ReplyMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids: the reply's


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: the rendered conversation's


class ChatChunkChoice(BaseModel):
    index: int
    # {"role": the reply's, "content": ""} first, then {"content": ...} and {"tool_calls": [...]}
    delta: dict[str, Any]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # in the last chunk, as in a whole reply's choice
    token_ids: list[int] | None = None  # return_token_ids: the chunk's new ones


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: in the first chunk


class ModelPermission(BaseModel):
    """What a client may do with a model, as vLLM's cards list it (OpenAI's old model objects
    had it; clients written for them read it)."""

    id: str
    object: Literal["model_permission"] = "model_permission"
    created: int
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inferlab"
    root: str
    parent: str | None = None  # a fine-tune's base model, as vLLM names a LoRA's: none here
    max_model_len: int
    permission: list[ModelPermission]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
