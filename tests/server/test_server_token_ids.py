"""return_token_ids (vLLM's): the prompt's and the reply's token ids beside the text.

References: the reply's ids are transformers' greedy continuation of the prompt's ids, and its
tokenizer decodes them to the reply's text; a prompt sent as ids comes back as sent; a stream's
chunks carry the whole answer's ids, the prompt's once, in the first chunk.
"""

from __future__ import annotations

import torch
from server_helpers import MODEL_NAME, tokenize

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]
ASK = {"model": MODEL_NAME, "max_tokens": 8, "temperature": 0.0}
IDS = {"return_token_ids": True, "ignore_eos": True}


def greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def test_a_completion_returns_its_prompt_s_and_its_reply_s_ids(fp32_client, fp32_server, hf_smollm,
                                                              hf_smollm_tokenizer):
    choice = fp32_client.completions.create(prompt=PROMPT, extra_body=IDS, **ASK).choices[0]
    prompt_ids = choice.model_extra["prompt_token_ids"]
    assert prompt_ids == tokenize(fp32_server, prompt=PROMPT)
    assert choice.model_extra["token_ids"] == greedy(hf_smollm, prompt_ids, 8)
    assert hf_smollm_tokenizer.decode(choice.model_extra["token_ids"]) == choice.text
    sent = fp32_client.completions.create(prompt=[7, 8, 9, 10], extra_body=IDS, **ASK).choices[0]
    assert sent.model_extra["prompt_token_ids"] == [7, 8, 9, 10]
    plain = fp32_client.completions.create(prompt=PROMPT, **ASK).choices[0]
    assert plain.model_extra.get("token_ids") is None and plain.model_extra.get("prompt_token_ids") is None


def test_a_streamed_completion_s_chunks_carry_the_whole_answer_s_ids(fp32_client):
    whole = fp32_client.completions.create(prompt=PROMPT, n=2, extra_body={**IDS, "seed": 1},
                                      **{**ASK, "temperature": 1.0}).choices
    chunks = list(fp32_client.completions.create(prompt=PROMPT, n=2, stream=True, extra_body={**IDS, "seed": 1},
                                            **{**ASK, "temperature": 1.0}))
    for choice in whole:
        mine = [c.choices[0].model_extra for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert sum((m["token_ids"] for m in mine), []) == choice.model_extra["token_ids"]
        assert [m["prompt_token_ids"] for m in mine if m["prompt_token_ids"] is not None] == [
            choice.model_extra["prompt_token_ids"]]
        assert mine[0]["prompt_token_ids"] is not None


def test_a_chat_reply_returns_the_conversation_s_and_the_reply_s_ids(fp32_client, fp32_server, hf_smollm,
                                                                    hf_smollm_tokenizer):
    whole = fp32_client.chat.completions.create(messages=MESSAGES, extra_body=IDS, **ASK)
    prompt_ids = whole.model_extra["prompt_token_ids"]
    assert prompt_ids == tokenize(fp32_server, messages=MESSAGES)
    reply_ids = whole.choices[0].model_extra["token_ids"]
    assert reply_ids == greedy(hf_smollm, prompt_ids, 8)
    assert hf_smollm_tokenizer.decode(reply_ids) == whole.choices[0].message.content
    chunks = list(fp32_client.chat.completions.create(messages=MESSAGES, stream=True, extra_body=IDS, **ASK))
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    assert all(c.model_extra.get("prompt_token_ids") is None for c in chunks[1:])
    streamed = [c.choices[0].model_extra.get("token_ids") or [] for c in chunks if c.choices]
    assert sum(streamed, []) == reply_ids


def test_a_reply_that_ends_the_prompt_s_last_character_shows_it(client, hf_smollm_tokenizer):
    """The prompt is "a" and two of 🤖's three byte tokens; the reply, forced, is the third.
    transformers decodes the whole to "a🤖"; the reply's text is what follows "a", in a stream
    too (it was "")."""
    prompt, robot_end = [81, 10813, 114], 240
    expected = hf_smollm_tokenizer.decode([*prompt, robot_end])[len(hf_smollm_tokenizer.decode(prompt[:1])):]
    assert expected == "\U0001f916"
    ask = {"prompt": prompt, "logit_bias": {str(robot_end): 100}, **ASK, "max_tokens": 1}
    whole = client.completions.create(extra_body=IDS, **ask).choices[0]
    assert (whole.text, whole.model_extra["token_ids"]) == (expected, [robot_end])
    assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **ask) if c.choices) == expected
