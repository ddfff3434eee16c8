"""Logprobs' token texts, bytes and text offsets against the text they describe.

References are independent of the code under test: the text a reply or an echo spells, and
each token's place in it, are written out by hand from the tokens' vocabulary entries and the
UTF-8 encoding; OpenAI documents a token's `bytes` as combining into the text.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from server_helpers import MODEL_NAME, start_server
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from inferlab.engine.outputs import TokenLogprobs
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo
from inferlab.server.logprobs import (
    TextOffsets,
    TokenTexts,
    append_completion_logprobs,
    chat_logprobs,
)
from inferlab.server.protocol import CompletionLogprobs

SP = "\u2581"
HELLO, SPACE, BYTE_E4, BYTE_BD, BYTE_A0 = 8, 3, 4, 5, 6
LLAMA2_DECODER = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)])


def _sentencepiece(decoder) -> TokenTexts:
    """A Llama-2-style vocabulary: "\u2581" for a space, <0xNN> for bytes it has no token for."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, SP: SPACE, "<0xE4>": BYTE_E4, "<0xBD>": BYTE_BD,
             "<0xA0>": BYTE_A0, "h": 7, f"{SP}hello": HELLO}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    backend.decoder = decoder
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return TokenTexts(TextTokenizer(backend, TokenizerInfo(bos_token="<s>", eos_token="</s>")))


# Llama 2's, and a Metaspace (T5's) after the byte fallback
SENTENCEPIECE_DECODERS = [LLAMA2_DECODER, decoders.Sequence([
    decoders.ByteFallback(), decoders.Fuse(), decoders.Metaspace(replacement=SP, prepend_scheme="first")])]


@pytest.mark.parametrize("decoder", SENTENCEPIECE_DECODERS)
def test_sentencepiece_tokens_keep_the_space_their_entry_begins_with(decoder):
    """Decoded alone, "\u2581hello" loses its space to the decoder (it drops a text's first
    one); logprobs give it as vLLM does, " hello", with the bytes b" hello"."""
    texts = _sentencepiece(decoder)
    assert texts.tokenizer.decode([HELLO], skip_special_tokens=False) == "hello"
    assert (texts(HELLO), texts.spelling(HELLO)) == (" hello", list(b" hello"))
    assert (texts(SPACE), texts.spelling(SPACE)) == (" ", [0x20])
    assert (texts(7), texts.spelling(7)) == ("h", [0x68])
    assert (texts(BYTE_E4), texts.spelling(BYTE_E4)) == ("\ufffd", [0xE4])
    assert (texts(1), texts.spelling(1)) == ("<s>", list(b"<s>"))


@pytest.mark.parametrize("decoder", SENTENCEPIECE_DECODERS)
def test_sentencepiece_reply_offsets_and_bytes_spell_its_text(decoder):
    """A reply " hello hello \u4f60 hello" (after a prompt, so its first space is kept):
    completions' offsets index each token in it, chat's bytes join into it."""
    texts = _sentencepiece(decoder)
    ids = [HELLO, HELLO, SPACE, BYTE_E4, BYTE_BD, BYTE_A0, HELLO]
    entries = [TokenLogprobs(token_id=t, logprob=-1.0, rank=1, top=[(t, -1.0)]) for t in ids]
    into = CompletionLogprobs()
    append_completion_logprobs(into, ids, entries, texts, TextOffsets(), top_n=1)
    assert into.tokens == [" hello", " hello", " ", "\ufffd", "\ufffd", "\ufffd", " hello"]
    # " hello hello \u4f60 hello": the three bytes of \u4f60 all begin where it does, at 13
    assert into.text_offset == [0, 6, 12, 13, 13, 13, 14]
    chat = chat_logprobs(entries, texts, texts.spelling, num_top=1)
    assert b"".join(bytes(t.bytes) for t in chat).decode() == " hello hello \u4f60 hello"
    assert [t.token for t in chat[0].top_logprobs] == [" hello"]


def test_tokens_that_read_alike_keep_the_chosen_ones_logprob():
    """Byte tokens all read "\ufffd": the top list keys them once, and the chosen token's key
    holds its own logprob (was: the last alternative's, -3.0)."""
    texts = _sentencepiece(LLAMA2_DECODER)
    entry = TokenLogprobs(token_id=BYTE_BD, logprob=-2.0, rank=2,
                          top=[(BYTE_E4, -0.5), (BYTE_BD, -2.0), (HELLO, -2.5), (BYTE_A0, -3.0)])
    into = CompletionLogprobs()
    append_completion_logprobs(into, [BYTE_BD], [entry], texts, TextOffsets(), top_n=4)
    assert into.token_logprobs == [-2.0]
    assert into.top_logprobs == [{"\ufffd": -2.0, " hello": -2.5}]
    # not chosen: the likeliest of those that read alike keeps the key
    entry = TokenLogprobs(token_id=HELLO, logprob=-2.5, rank=3, top=entry.top)
    into = CompletionLogprobs()
    append_completion_logprobs(into, [HELLO], [entry], texts, TextOffsets(), top_n=4)
    assert into.top_logprobs == [{"\ufffd": -0.5, " hello": -2.5}]


@pytest.mark.parametrize(("raw", "offsets"), [
    ([b"\xe4"] * 5, [0, 1, 2, 3, 4]),            # each E4 is cut by the next: one U+FFFD each
    ([b"\xe4", b"\xbd", b"A"], [0, 0, 1]),       # E4 BD cut by "A": one U+FFFD for both
    ([b"\xe4", b"\xbd", b"\xa0", b"a"], [0, 0, 0, 1]),  # \u4f60 whole
    ([b"a\xe4", b"\xe4\xbd\xa0"], [0, 2]),        # the second token begins after a's U+FFFD
    ([b"\xe4", b"", b"a"], [0, 0, 1]),           # a token of no bytes cuts nothing
])
def test_text_offsets_place_a_cut_characters_replacement_before_the_next_token(raw, offsets):
    counter = TextOffsets()
    assert [counter.begin(r) for r in raw] == offsets


@pytest.fixture(scope="module")
def sentencepiece_server(tmp_path_factory):
    """A random two-layer Llama behind a Llama-2-style vocabulary (BOS added to a text prompt;
    "▁the" and "▁hello" are tokens), served."""
    transformers = pytest.importorskip("transformers")
    import torch

    from inferlab.config import EngineConfig
    from inferlab.engine.async_engine import AsyncEngine

    model_dir = tmp_path_factory.mktemp("sentencepiece_llama")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    merges = []
    for word in (f"{SP}the", f"{SP}hello"):
        for n in range(1, len(word) + 1):
            vocab.setdefault(word[n - 1], len(vocab))
            vocab.setdefault(word[:n], len(vocab))
        merges += [(word[:n], word[n]) for n in range(1, len(word))]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    backend.decoder = LLAMA2_DECODER
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    backend.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2)).save_pretrained(model_dir)
    engine = AsyncEngine.from_config(EngineConfig(model=str(model_dir), dtype="float32",
                                                  kv_cache_memory_bytes=8 * 2**20, max_model_len=256))
    yield from start_server(engine)
    asyncio.run(engine.shutdown(timeout_s=0))


def test_sentencepiece_reply_and_echo_offsets_index_the_text(sentencepiece_server):
    """The tokens of a reply after a prompt keep their space, their offsets step by 6 over
    " hello"s; an echoed text prompt lacks the BOS and the first word's space its tokens spell,
    and its tokens are placed from its end: the reply begins at its length."""
    server = sentencepiece_server
    hello = str(server.engine.tokenizer.encode("hello", add_special_tokens=False)[0])
    out = _completion(server, prompt="the", max_tokens=4, logit_bias={hello: 100}, logprobs=1)
    assert out["text"] == " hello" * 4 and out["logprobs"]["tokens"] == [" hello"] * 4
    assert out["logprobs"]["text_offset"] == [0, 6, 12, 18]
    echo = _completion(server, prompt="the the the", max_tokens=2, logit_bias={hello: 100},
                       logprobs=1, echo=True)
    assert echo["text"] == "the the the hello hello"
    assert echo["logprobs"]["tokens"] == ["<s>", " the", " the", " the", " hello", " hello"]
    assert echo["logprobs"]["text_offset"] == [0, 0, 3, 7, 11, 17]


def _completion(server, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                   json={"model": MODEL_NAME, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_offsets_after_invalid_bytes_count_one_replacement_each(server):
    """Token 175 is the byte E4 alone: five of them are five characters cut short (the last
    still waiting for its end), so token k begins at k."""
    out = _completion(server, prompt="Say something:", max_tokens=5, logit_bias={"175": 100},
                      logprobs=1)
    assert out["text"] == "\ufffd" * 4
    assert out["logprobs"]["text_offset"] == [0, 1, 2, 3, 4]


def test_echo_of_token_ids_keeps_special_tokens(server):
    """The ids of "<|im_start|>user\\nHi \u4f60\u597d<|im_end|>\\n<|im_start|>assistant\\n":
    echoed whole, special tokens too (vLLM decodes the ids with them), each token's offset
    where it begins in that text, the two bytes tokens of each Chinese character at its start."""
    prompt = "<|im_start|>user\nHi \u4f60\u597d<|im_end|>\n<|im_start|>assistant\n"
    ids = [1, 4093, 198, 26843, 216, 18645, 250, 48392, 138, 2, 198, 1, 520, 9531, 198]
    out = _completion(server, prompt=ids, echo=True, max_tokens=3, logprobs=1, temperature=0,
                      ignore_eos=True)
    assert out["text"].startswith(prompt)
    offsets = out["logprobs"]["text_offset"]
    assert offsets[:len(ids)] == [0, 12, 16, 17, 19, 20, 20, 21, 21, 22, 32, 33, 45, 48, 54]
    assert offsets[len(ids):][0] == len(prompt) and offsets == sorted(offsets)


def test_streamed_chat_names_the_stop_string_in_its_last_chunk(server):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Count: one two three"}],
            "max_tokens": 30, "temperature": 0, "stop": ["three"]}
    whole = httpx.post(f"{server.url}/v1/chat/completions", headers=server.headers, timeout=60,
                       json=body).json()["choices"][0]
    assert (whole["finish_reason"], whole["stop_reason"]) == ("stop", "three")
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", headers=server.headers,
                      timeout=60, json={**body, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    last = chunks[-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", "three")
    assert all(c["choices"][0]["stop_reason"] is None for c in chunks[:-1])


def test_a_reply_cut_inside_a_character_of_byte_tokens_ends_before_it(sentencepiece_server):
    """The prompt's ids end with " hello" and 🤖's first byte; the reply, forced, is two <0x9F>s,
    cut by max_tokens three bytes into a four-byte character. Its text, whole and streamed, is
    decode of the reply less that character's tokens: "" (it was two U+FFFDs)."""
    server = sentencepiece_server
    backend = server.engine.tokenizer.backend
    hello, f0, x9f = (backend.token_to_id(e) for e in (f"{SP}hello", "<0xF0>", "<0x9F>"))
    assert backend.decode([hello, f0, x9f, x9f]) == "hello" + "\ufffd" * 3
    body = {"model": MODEL_NAME, "prompt": [1, hello, f0], "max_tokens": 2, "logit_bias": {str(x9f): 100}}
    whole = _completion(server, **body)
    assert (whole["text"], whole["finish_reason"]) == ("", "length")
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=server.headers, timeout=60,
                      json={**body, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == ""
