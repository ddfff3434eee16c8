"""Chat completions through the official `openai` client, whole and streamed: the chat prompt is
the SmolLM2 template written out by hand, streamed text equals the whole text, and greedy
logprobs name the chosen token first."""

from __future__ import annotations

import httpx
from server_helpers import MODEL_NAME, token_counts, tokenize

GREEDY = {"temperature": 0.0}

SMOLLM2_CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")


def test_chat_uses_the_model_template(client, server):
    messages = [{"role": "user", "content": "Say hi"}]
    ids = tokenize(server, messages=messages)
    r = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, headers=server.headers,
                   timeout=30)
    decoded = r.json()["prompt"]
    assert decoded.replace("<|im_start|>", "").replace("<|im_end|>", "") == \
        SMOLLM2_CHAT.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert ids == tokenize(server, prompt=SMOLLM2_CHAT, add_special_tokens=False)
    reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4,
                                           **GREEDY)
    assert reply.usage.prompt_tokens == len(ids)
    # echo of a user's last message: not the reply's role, so nothing goes before the reply
    same = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4,
                                          extra_body={"echo": True}, **GREEDY)
    assert same.choices[0].message.content == reply.choices[0].message.content
    # without the generation prompt, the template stops before the assistant's turn
    bare = SMOLLM2_CHAT.removesuffix("<|im_start|>assistant\n")
    reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=4,
                                           extra_body={"add_generation_prompt": False}, **GREEDY)
    assert reply.usage.prompt_tokens == len(tokenize(server, prompt=bare, add_special_tokens=False))
    # continue_final_message: the template written out by hand up to the prefilled reply
    prefilled = messages + [{"role": "assistant", "content": "Hi there, my name"}]
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=prefilled, max_tokens=4, **GREEDY,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    opened = SMOLLM2_CHAT + "Hi there, my name"
    assert reply.usage.prompt_tokens == len(tokenize(server, prompt=opened, add_special_tokens=False))
    assert tokenize(server, messages=prefilled, add_generation_prompt=False, continue_final_message=True) \
        == tokenize(server, prompt=opened, add_special_tokens=False)
    # echo puts the prefilled reply before the continuation, whole or streamed
    prefill = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    echoed = client.chat.completions.create(model=MODEL_NAME, messages=prefilled, max_tokens=4,
                                            extra_body=prefill, **GREEDY).choices[0].message.content
    assert echoed == "Hi there, my name" + reply.choices[0].message.content
    streamed = client.chat.completions.create(model=MODEL_NAME, messages=prefilled, max_tokens=4,
                                              extra_body=prefill, stream=True, **GREEDY)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == echoed


def test_chat_stream_role_first_finish_last_and_equal_to_whole(client):
    messages = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}]
    whole = client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                           max_completion_tokens=10, **GREEDY)
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 10

    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages,
                                                 max_completion_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert with_choices[-1].choices[0].finish_reason == choice.finish_reason
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == choice.message.content
    assert chunks[-1].choices == [] and token_counts(chunks[-1].usage) == token_counts(whole.usage)

    as_string = [messages[0], {"role": "user", "content": "Name a fruit."}]
    same = client.chat.completions.create(model=MODEL_NAME, messages=as_string,
                                          max_tokens=10, **GREEDY)
    assert same.choices[0].message.content == choice.message.content


def test_chat_logprob_bytes_spell_characters_split_across_tokens(client):
    """Each emoji here is four byte tokens, each decoding alone to U+FFFD: their `bytes` are
    what they stand for, so that the entries' bytes together spell the reply (OpenAI's use)."""
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Write emojis only: 🎉🎈🥳😀"}],
        max_tokens=8, logprobs=True, top_logprobs=2, **GREEDY)
    content = out.choices[0].logprobs.content
    assert any(e.token == "\ufffd" for e in content)
    joined, reply = b"".join(bytes(e.bytes) for e in content), out.choices[0].message.content
    # the last emoji is cut by max_tokens: the reply leaves its first bytes out
    assert joined.startswith(reply.encode()) and len(joined) - len(reply.encode()) < 4
    for entry in content:
        assert entry.top_logprobs[0].bytes == entry.bytes  # greedy: the top token


def test_chat_logprobs_and_n(client):
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Count to five."}], max_tokens=6,
        logprobs=True, top_logprobs=3, n=2, **GREEDY, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].message.content == out.choices[1].message.content  # greedy twice
    content = out.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.token == entry.top_logprobs[0].token  # greedy: the most likely token
        assert entry.logprob == entry.top_logprobs[0].logprob <= 0
        assert bytes(entry.bytes) == entry.token.encode()
    assert "".join(e.token for e in content).startswith(out.choices[0].message.content)

    streamed = list(client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Count to five."}], max_tokens=6,
        logprobs=True, top_logprobs=3, stream=True, **GREEDY, extra_body={"ignore_eos": True}))
    tokens = [e.token for c in streamed if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content]
    assert tokens == [e.token for e in content]
