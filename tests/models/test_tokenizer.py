"""Tokenizers and chat templates agree with transformers; detokenization is UTF-8 safe."""

from __future__ import annotations

import pytest

from inferlab.engine.chat_prompt import ChatError, chat_prompt_text
from inferlab.engine.detokenizer import IncrementalDetokenizer
from inferlab.models.tokenizer import load_hf_tokenizer

UNICODE_CASES = [
    "", " ", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\r\n",
    "naïve café – “quotes” — ellipsis…", "日本語のテキストと中文", "emoji 🤖🚀👩‍👩‍👧 flags 🇫🇷",
    "combining e\u0301 and a\u0308", "math ∑∫√∞ ≠ ≤", "Ж Щ Ю", "مرحبا بالعالم", "12345678901234567890",
    "<|im_start|>user\nhi<|im_end|>", "don't won't y'all", "\u200b zero width",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "and 3+3?"}],
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell me a joke"},
     {"role": "assistant", "content": "Why did the chicken cross the road?"},
     {"role": "user", "content": "Why?"}],
    [{"role": "user", "content": "Unicode: café 🤖"}],
]


def test_ids_match_transformers_on_wikitext(smollm_fp32, hf_smollm_tokenizer, shared_file):
    path = shared_file("wikitext-2-raw/wiki.test.raw")
    lines = path.read_text(encoding="utf-8").splitlines()[:500]
    ours = smollm_fp32.tokenizer
    mismatches = [line for line in lines
                  if ours.encode(line) != hf_smollm_tokenizer(line).input_ids]
    assert not mismatches, mismatches[:3]


@pytest.mark.parametrize("text", UNICODE_CASES)
def test_ids_match_transformers_on_unicode(smollm_fp32, hf_smollm_tokenizer, text):
    assert smollm_fp32.tokenizer.encode(text) == hf_smollm_tokenizer(text).input_ids
    ids = smollm_fp32.tokenizer.encode(text)
    assert smollm_fp32.tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_template_renders_like_transformers(smollm_fp32, hf_smollm_tokenizer, generation_prompt):
    for conversation in CONVERSATIONS:
        ours = smollm_fp32.tokenizer.apply_chat_template(conversation, generation_prompt)
        expected = hf_smollm_tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=generation_prompt)
        assert ours == expected


@pytest.mark.parametrize("prefill", ["d", "", "end", "\n", "Sure, here  ", "<|im_end|>"])
def test_continue_final_message_cuts_like_transformers(smollm_fp32, hf_smollm_tokenizer, prefill):
    """The prompt stops where the prefilled reply does: "d" also sits in the turn's end marker
    "<|im_end|>", and an empty reply still opens the assistant's turn."""
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": prefill}]
    ours = chat_prompt_text(smollm_fp32.tokenizer, conversation, add_generation_prompt=False,
                            continue_final_message=True)
    expected = hf_smollm_tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=False, continue_final_message=True)
    assert ours == expected


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_earlier_thinking_reaches_the_template_as_transformers_passes_it(smollm_fp32, hf_smollm_tokenizer,
                                                                          field):
    template = ("{% for m in messages %}{{ m.role }}:{{ m.reasoning_content }}|{{ m.thinking }}|"
                "{{ m.content }}\n{% endfor %}")
    conversation = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Hello.", field: "They greet me."},
                    {"role": "user", "content": "bye"}]
    ours = chat_prompt_text(smollm_fp32.tokenizer, conversation, template=template)
    expected = hf_smollm_tokenizer.apply_chat_template(
        conversation, chat_template=template, tokenize=False, add_generation_prompt=True)
    assert ours == expected and "assistant:They greet me.|They greet me.|Hello." in ours


@pytest.mark.parametrize(("arguments", "rendered"), [
    ('{"city": "Paris"}', '{"city": "Paris"}'), ("", "{}"), ("not json", '"not json"')])
def test_earlier_calls_arguments_reach_the_template_as_objects(smollm_fp32, arguments, rendered):
    """As vLLM gives them: JSON as an object, empty as {}; other text stays text."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    conversation = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [call]}]
    template = "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}"
    assert chat_prompt_text(smollm_fp32.tokenizer, conversation, add_generation_prompt=False,
                            template=template) == rendered


def test_a_final_message_the_template_does_not_write_cannot_be_continued(smollm_fp32):
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(ChatError, match="does not write the final message's content"):
        chat_prompt_text(smollm_fp32.tokenizer, conversation, add_generation_prompt=False,
                         continue_final_message=True,
                         template="{% for m in messages[:-1] %}{{ m.content }}{% endfor %}")


@pytest.mark.parametrize("tools", [None, [], [{"type": "function", "function": {"name": "f"}}]])
def test_templates_get_tools_and_documents_as_transformers_gives_them(smollm_fp32, hf_smollm_tokenizer,
                                                                     tools):
    """None where there are none, not undefined (`tools is not none` held for undefined), and
    `{% generation %}` blocks render as their text."""
    template = ("{% if tools is not none %}T{% endif %}|{{ tools }}|{{ documents }}|{% for m in "
                "messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}")
    conversation = [{"role": "user", "content": "hi"}]
    ours = smollm_fp32.tokenizer.apply_chat_template(conversation, False, template=template, tools=tools)
    expected = hf_smollm_tokenizer.apply_chat_template(
        conversation, tools=tools, chat_template=template, tokenize=False)
    assert ours == expected


def test_hf_directory_tokenizer(tmp_path, hf_smollm_tokenizer):
    hf_smollm_tokenizer.save_pretrained(tmp_path)
    ours = load_hf_tokenizer(str(tmp_path))
    for text in UNICODE_CASES:
        assert ours.encode(text) == hf_smollm_tokenizer(text).input_ids
    assert ours.apply_chat_template(CONVERSATIONS[1]) == hf_smollm_tokenizer.apply_chat_template(
        CONVERSATIONS[1], tokenize=False, add_generation_prompt=True)
    assert ours.eos_token_id == hf_smollm_tokenizer.eos_token_id


def test_incremental_detokenization_never_splits_a_character(smollm_fp32):
    tokenizer = smollm_fp32.tokenizer
    text = "emoji 🤖🚀 and 日本語, then plain words again 👩‍👩‍👧."
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, [], stop=[])
    deltas = [detok.add([t], finished=i == len(ids) - 1)[0] for i, t in enumerate(ids)]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    # at least one token alone is half a character, so the holding back was exercised
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)


@pytest.mark.parametrize(("text", "cut", "shown"), [
    ("a\ufffd", 0, "a\ufffd"),  # U+FFFD itself ends a reply whole (it once came out as "a")
    ("\ufffd", 0, "\ufffd"),
    ("ok \u05e2", 1, "ok "),  # cut inside U+05E2 (d7 a2): of its token " \xd7", the space stays
])
def test_a_finished_reply_keeps_what_its_tokens_spell(smollm_fp32, text, cut, shown):
    tokenizer = smollm_fp32.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    ids = ids[:len(ids) - cut]
    detok = IncrementalDetokenizer(tokenizer, [], stop=[])
    deltas = [detok.add([t], finished=False)[0] for t in ids] + [detok.add([], finished=True)[0]]
    assert "".join(deltas) == shown


@pytest.mark.parametrize(("entries", "shown"), [  # byte-level vocabulary entries, each a token
    (["x", "ï¿½", "é"], "x\ufffd"),  # U+FFFD (ef bf bd) kept, the lead byte e9 after it not
    (["ĠÂ"], " "),  # the space in the token that begins c2 stays
    (["ĠÂ", "ĠÂ", "ĠÂ"], " \ufffd \ufffd "),  # c2 then a space is no UTF-8: what decode says
    (["Ģ", "ä"], "\ufffd"),  # a stray 80, then e4 cut short
])
def test_a_reply_cut_inside_a_character_loses_only_that_character(smollm_fp32, entries, shown):
    tokenizer = smollm_fp32.tokenizer
    ids = [tokenizer.backend.token_to_id(e) for e in entries]
    detok = IncrementalDetokenizer(tokenizer, [], stop=[])
    text = "".join(detok.add([t], finished=i == len(ids) - 1)[0] for i, t in enumerate(ids))
    assert text == shown


def test_a_stop_string_in_text_written_before_min_tokens_is_not_found_later(smollm_fp32):
    """"." lies before min_tokens' end; a longer stop string beside it once widened the search
    back over it, and the reply stopped there."""
    tokenizer = smollm_fp32.tokenizer
    ids = tokenizer.encode(" Paris.\n\nThe answer is", add_special_tokens=False)
    searched_from = len(tokenizer.encode(" Paris.", add_special_tokens=False))
    detok = IncrementalDetokenizer(tokenizer, [], stop=[".", "zzzzzzzz"])
    hits = [detok.add([t], finished=False, find_stops=i >= searched_from)[1] for i, t in enumerate(ids)]
    assert hits == [None] * len(ids)
    assert detok.add([], finished=True)[0] and detok.text == " Paris.\n\nThe answer is"


def test_stop_string_across_token_boundaries(smollm_fp32):
    tokenizer = smollm_fp32.tokenizer
    ids = tokenizer.encode("alpha beta gamma delta")
    detok = IncrementalDetokenizer(tokenizer, [], stop=["ta gam"])
    shown, hit = "", None
    for t in ids:
        delta, hit = detok.add([t], finished=False)
        shown += delta
        if hit:
            break
    assert hit == "ta gam"
    assert shown == "alpha be" and detok.text == "alpha be"
