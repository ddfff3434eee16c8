"""Tool calling through the official `openai` client, as vLLM serves it: a named function and
"required" (the reply held to the tools' schemas), "auto" read by the hermes, llama3_json and
mistral parsers, the tools and earlier calls given to the chat template. References: the jsonschema
library for the arguments, and hand-written prompts for what the template must render."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
from server_helpers import API_KEY, MODEL_NAME, RunningServer, start_server

GREEDY = {"temperature": 0.0}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "maxLength": 30}, "limit": {"type": "integer", "minimum": 1,
                                                               "maximum": 10}}}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, SEARCH)}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# a template that shows what it is given: the tools, earlier calls, and the tool's answers
TOOL_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }}{{ t.function.parameters | tojson }}"
    "{% endfor %}</tools>{{ '\\n' }}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}"
    "{% if m.tool_call_id %} {{ m.tool_call_id }}{% endif %}{{ '\\n' }}{% if m.tool_calls %}"
    "{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} {{ c.function.arguments.city }}"
    "</tool_call>{% endfor %}{% else %}{{ m.content }}{% endif %}<|im_end|>{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}")


def tool_server(engine, parser: str) -> Iterator[RunningServer]:
    yield from start_server(engine, api_key=API_KEY, enable_auto_tool_choice=True,
                            tool_call_parser=parser, chat_template=TOOL_TEMPLATE)


@pytest.fixture(scope="module")
def hermes_client(engine):
    for server in tool_server(engine, "hermes"):
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                            timeout=120)


@pytest.fixture(scope="module")
def mistral_client(engine):
    for server in tool_server(engine, "mistral"):
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                            timeout=120)


@pytest.fixture(scope="module")
def llama3_client(engine):
    for server in tool_server(engine, "llama3_json"):
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                            timeout=120)


def streamed(client, **request) -> tuple[str | None, list[tuple[str, str, str]], str]:
    """(content, [(id, name, arguments)], finish_reason) put together from a stream's deltas."""
    content, calls, finish = None, {}, None
    for chunk in client.chat.completions.create(model=MODEL_NAME, stream=True, **request):
        for choice in chunk.choices:
            if choice.delta.content:
                content = (content or "") + choice.delta.content
            for piece in choice.delta.tool_calls or ():
                if piece.id is not None:  # a call's first piece: its id, type and name
                    assert piece.index == len(calls) and piece.type == "function"
                    calls[piece.index] = [piece.id, piece.function.name, ""]
                calls[piece.index][2] += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [tuple(c) for c in calls.values()], finish


def argument_pieces(client, **request) -> int:
    """How many stream chunks carried a piece of a call's arguments."""
    return sum(bool(piece.function.arguments)
               for chunk in client.chat.completions.create(model=MODEL_NAME, stream=True, **request)
               for choice in chunk.choices for piece in choice.delta.tool_calls or ())


def whole(client, **request) -> tuple[str | None, list[tuple[str, str, str]], str]:
    choice = client.chat.completions.create(model=MODEL_NAME, **request).choices[0]
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or ()]
    assert all(c.type == "function" for c in choice.message.tool_calls or ())
    return choice.message.content, calls, choice.finish_reason


def without_ids(reply):
    content, calls, finish = reply
    return content, [(name, arguments) for _, name, arguments in calls], finish


def test_a_named_function_answers_with_its_arguments(client):
    """tool_choice naming a function: one call of it, its arguments valid for its parameters;
    streamed, the same call piece by piece."""
    request = {"messages": MESSAGES, "tools": [SEARCH, WEATHER], "max_tokens": 60, **GREEDY,
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    content, calls, finish = reply = whole(client, **request)
    assert content is None and finish == "stop"  # OpenAI's reason for a forced call
    ((call_id, name, arguments),) = calls
    assert call_id.startswith("chatcmpl-tool-") and name == "get_weather"
    jsonschema.validate(json.loads(arguments), SCHEMAS["get_weather"])
    assert without_ids(streamed(client, **request)) == without_ids(reply)


REQUIRED = {"messages": [{"role": "user", "content": "Search for cheap flights, then tell me the "
                                                   "weather in Rome."}],
            "tools": [SEARCH, WEATHER], "tool_choice": "required", **GREEDY}


def test_required_answers_with_calls_of_the_given_tools(client):
    """tool_choice "required": one or more calls, each of a given tool with valid arguments;
    parallel_tool_calls false: one call; streamed, the same calls."""
    request = {**REQUIRED, "max_tokens": 120}
    content, calls, finish = reply = whole(client, **request)
    # greedy closes its array at 49 tokens (one cut by max_tokens has no calls: below)
    assert content is None and finish == "tool_calls" and calls
    for _, name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    assert len({call_id for call_id, _, _ in calls}) == len(calls)
    assert without_ids(streamed(client, **request)) == without_ids(reply)
    # greedy goes on calling above; sampled too, so that both tools' shapes are read
    for sampling in (GREEDY, {"temperature": 1.0, "seed": 0}, {"temperature": 1.0, "seed": 1}):
        content, calls, finish = whole(client, **{**request, **sampling,
                                                  "parallel_tool_calls": False})
        assert content is None and len(calls) == 1 and finish == "tool_calls"
        jsonschema.validate(json.loads(calls[0][2]), SCHEMAS[calls[0][1]])


@pytest.mark.parametrize(("max_tokens", "sent"), [
    (22, ""), (34, '{\n        "city": "Rome",\n        "un'),
    (46, '{\n        "city": "Rome",\n        "unit": "celsius"\n    }'),  # the array left open
])
def test_a_whole_required_reply_cut_short_has_no_calls(fp32_client, max_tokens, sent):
    """max_tokens ends fp32 greedy's array (one get_weather call, closed at 49 tokens) before it
    closes: the whole reply has no calls and empty content, as vLLM validates the array whole (it
    once held a call whose arguments were no JSON, '' at 22 tokens); the stream has sent the
    call's pieces as they came. fp32: bf16's greedy tokens space the JSON otherwise."""
    assert whole(fp32_client, **REQUIRED, max_tokens=max_tokens) == ("", [], "length")
    assert without_ids(streamed(fp32_client, **REQUIRED, max_tokens=max_tokens)) == (
        None, [("get_weather", sent)], "length")


def test_tool_choice_none_answers_in_text(client):
    content, calls, finish = whole(client, messages=MESSAGES, tools=[WEATHER], tool_choice="none",
                                   max_tokens=8, **GREEDY)
    assert content and not calls and finish == "length"


@pytest.mark.parametrize(("client_name", "forced", "calls_text"), [
    ("hermes_client",
     r'Checking\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,8}", '
     r'"unit": "celsius"\}\}\n</tool_call>', "Checking.\n"),
    ("llama3_client",
     r'\{"name": "get_weather", "parameters": \{"city": "[A-Z][a-z]{2,8}", "unit": "celsius"\}\}',
     None),
    ("mistral_client",
     r'\[TOOL_CALLS\]\[\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,8}", '
     r'"unit": "celsius"\}\}\]', None),
])
def test_auto_reads_the_calls_the_model_writes(request, client_name, forced, calls_text):
    """tool_choice "auto" (the default with tools): the server's parser reads the calls out of
    the text, here held by a regex to the parser's format, whole and streamed."""
    client = request.getfixturevalue(client_name)
    body = {"messages": MESSAGES, "tools": [WEATHER], "max_tokens": 60, **GREEDY,
            "extra_body": {"guided_regex": forced}}
    content, calls, finish = reply = whole(client, **body)
    assert content == calls_text and finish == "tool_calls"
    ((_, name, arguments),) = calls
    assert name == "get_weather" and json.loads(arguments)["unit"] == "celsius"
    assert without_ids(streamed(client, **body)) == without_ids(reply)
    assert argument_pieces(client, **body) > 3  # the arguments go out as the model writes them
    plain = whole(client, **{**body, "extra_body": {"guided_regex": "It is sunny"}})
    assert plain == ("It is sunny", [], "stop")  # no call written: plain content


def test_auto_keeps_the_first_call_without_parallel_tool_calls(hermes_client):
    """The model writes two calls; with parallel_tool_calls false the reply has the first only,
    whole and streamed, as vLLM filters them."""
    two = "".join(f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>\n'
                  for city in ("Paris", "Rome"))
    body = {"messages": MESSAGES, "tools": [WEATHER], "max_tokens": 100, **GREEDY,
            "extra_body": {"guided_choice": [two]}}
    assert [name for _, name, _ in whole(hermes_client, **body)[1]] == ["get_weather"] * 2
    single = {**body, "parallel_tool_calls": False}
    content, calls, finish = reply = whole(hermes_client, **single)
    assert [json.loads(arguments) for _, _, arguments in calls] == [{"city": "Paris"}]
    assert finish == "tool_calls" and without_ids(streamed(hermes_client, **single)) == without_ids(reply)


def test_the_template_gets_the_tools_and_the_earlier_calls(hermes_client):
    """What the chat template renders, read back through /tokenize and /detokenize: the tools'
    definitions, an assistant's earlier call (its arguments as an object), the tool's answer."""
    base = str(hermes_client.base_url).removesuffix("/v1/")
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    headers = {"Authorization": f"Bearer {API_KEY}"}

    def tokens(**body) -> list[int]:
        return httpx.post(f"{base}/tokenize", headers=headers, json=body).json()["tokens"]

    parameters = json.dumps(WEATHER["function"]["parameters"])
    assert tokens(messages=messages, tools=[WEATHER]) == tokens(add_special_tokens=False, prompt=(
        f"<tools>get_weather{parameters}</tools>\n"
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>get_weather Paris</tool_call><|im_end|>\n"
        "<|im_start|>tool call_1\n18 C<|im_end|>\n<|im_start|>assistant\n"))


def test_tool_choice_none_shows_the_tools_unless_excluded(engine):
    """With "none" the template still gets the tools (vLLM's default), and does not with
    --exclude-tools-when-tool-choice-none: the prompts' token counts tell."""
    counts = []
    for exclude in (False, True):
        for server in start_server(engine, api_key=API_KEY, chat_template=TOOL_TEMPLATE,
                                   exclude_tools_when_tool_choice_none=exclude):
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
            usage = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=1,
                                                   tools=[WEATHER], tool_choice="none").usage
            prompts = [httpx.post(f"{server.url}/tokenize", headers=server.headers, json={
                "messages": MESSAGES, **tools}).json()["count"] for tools in ({"tools": [WEATHER]}, {})]
            counts.append((usage.prompt_tokens, *prompts))
    (shown, with_tools, without), (hidden, _, _) = counts
    assert shown == with_tools > without == hidden


def test_a_parser_that_reads_special_tokens_keeps_them_in_the_text(engine):
    """Llama 3's <|python_tag|> is a special token, which the reply's text would drop; a parser
    whose markers are special tokens of the model asks for them. Here <|im_end|> stands for one:
    it is special in SmolLM2, <tool_call> is plain text."""
    from inferlab.server.chat import _marks_special
    from inferlab.server.tools import ToolUse

    def marks(*markers: str) -> bool:
        return _marks_special(ToolUse(None, None, None, markers), engine.tokenizer)

    assert marks("<|im_end|>") and marks("<tool_call>", "<|im_end|>")
    assert not marks("<tool_call>", "</tool_call>") and not marks()


def test_a_whole_reply_cut_inside_a_call_is_its_text(hermes_client):
    """max_tokens ends the second call mid-arguments (53 tokens as the tokenizer cuts the text:
    '... {"city": "Rome'): the whole reply is the text and no calls, as vLLM's hermes parser
    gives a reply it cannot json.loads (it once held a call whose arguments were '{"city');
    the stream has sent the calls' pieces as they came."""
    two = "".join(f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>\n'
                  for city in ("Paris", "Rome"))
    body = {"messages": MESSAGES, "tools": [WEATHER], **GREEDY, "extra_body": {"guided_choice": [two]}}
    assert len(whole(hermes_client, **body, max_tokens=100)[1]) == 2  # uncut: both calls
    content, calls, finish = whole(hermes_client, **body, max_tokens=53)
    assert (calls, finish) == ([], "length")
    assert content.endswith('{"city": "Rome') and two.startswith(content)
    pieces = streamed(hermes_client, **body, max_tokens=53)[1]
    assert [arguments for _, _, arguments in pieces] == ['{"city": "Paris"}', '{"city": "Rome']
