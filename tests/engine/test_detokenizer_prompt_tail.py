"""A prompt whose token ids end (or whose last few tokens begin) partway through a character: the
output that finishes the character shows it, and nothing after it is lost.

Reference: the tokenizer's own decode of prompt and output together, less the decoded prompt up
to its last whole character (what vLLM's incremental detokenizer shows). Before, "a" + two of
🤖's three byte-level tokens, then the third and "b", showed "b"; with a byte-fallback
SentencePiece vocabulary the characters after the finished one were lost as well.

An output that does not go on with the prompt's unfinished character leaves its bytes, and their
U+FFFD, in the prompt: "a" + two of 🤖's tokens, then " hello", showed "\ufffd hello" (vLLM shows
" hello").

A reply that finishes cut partway through a character ends before it: the reference is decode of
the tokens less the cut character's. A byte fallback once left one U+FFFD per byte of it, and the
whole characters before it in the same run of bytes came out as U+FFFDs too.
"""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from inferlab.engine.detokenizer import IncrementalDetokenizer
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo

SP = "\u2581"


@pytest.fixture(scope="module")
def embedded_tokenizer(embedded_gguf):
    from inferlab.models.loader import load_tokenizer

    return load_tokenizer(embedded_gguf)


@pytest.fixture(scope="module")
def byte_fallback_tokenizer() -> TextTokenizer:
    """Llama 2's kind: "\u2581" for a space, <0xNN> for the bytes of a character with no token."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    merges = [(SP, "h"), (f"{SP}h", "e"), ("l", "l"), (f"{SP}he", "ll"), (f"{SP}hell", "o"), (SP, SP)]
    for piece in [*f"{SP}abcdehlow,!", *(a + b for a, b in merges)]:
        vocab.setdefault(piece, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    backend.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return TextTokenizer(backend, TokenizerInfo(bos_token="<s>", eos_token="</s>"))


def reference(tokenizer: TextTokenizer, prompt: list[int], output: list[int], skip: bool) -> str:
    """decode(prompt + output) after decode(prompt) where the output leaves that as it was (it
    does not go on with a character the prompt leaves unfinished), else after decode(prompt up
    to its last whole character); the texts tested hold no U+FFFD of their own, so one at the
    end is a character not finished."""
    whole_text = tokenizer.decode(prompt + output, skip)
    if whole_text.startswith(prompt_text := tokenizer.decode(prompt, skip)):
        return whole_text[len(prompt_text):]
    whole = len(prompt)
    while tokenizer.decode(prompt[:whole], skip).endswith("\ufffd"):
        whole -= 1
    return whole_text[len(tokenizer.decode(prompt[:whole], skip)):]


def shown(tokenizer: TextTokenizer, prompt: list[int], output: list[int], skip: bool = True) -> str:
    """The output's text as the detokenizer hands it out, one token at a time."""
    detok = IncrementalDetokenizer(tokenizer, prompt, [], skip_special_tokens=skip)
    return "".join(detok.add([t], finished=i == len(output) - 1)[0] for i, t in enumerate(output))


def test_the_reported_prompt_ends_two_bytes_into_a_robot(embedded_tokenizer):
    prompt, output = [81, 10813, 114], [240, 82]
    assert embedded_tokenizer.decode(prompt + output) == "a\U0001f916b"
    assert shown(embedded_tokenizer, prompt, output) == "\U0001f916b"


@pytest.mark.parametrize("text", ["a\U0001f916b", "x \u65e5\u672c hello", "\u00e9, \U0001f916\U0001f916 y"])
def test_every_prompt_split_of_a_byte_level_vocabulary(embedded_tokenizer, text):
    ids = embedded_tokenizer.encode(text, add_special_tokens=False)
    assert any(embedded_tokenizer.decode(ids[:k]).endswith("\ufffd") for k in range(len(ids)))
    for k in range(len(ids)):
        assert shown(embedded_tokenizer, ids[:k], ids[k:]) == reference(embedded_tokenizer, ids[:k], ids[k:], True), k


@pytest.mark.parametrize("text", ["\U0001f916 hello a  b   c", "hello \U0001f916\U0001f916 world",
                                  "\u00e9, hello! we"])
def test_every_prompt_split_of_a_byte_fallback_vocabulary(byte_fallback_tokenizer, text):
    """Two 🤖 take eight byte tokens: some splits also begin the last five prompt tokens (the
    detokenizer's context) inside a character, which the byte fallback decodes to U+FFFDs."""
    ids = byte_fallback_tokenizer.encode(text, add_special_tokens=False)
    for k in range(len(ids)):
        assert shown(byte_fallback_tokenizer, ids[:k], ids[k:]) == reference(
            byte_fallback_tokenizer, ids[:k], ids[k:], True), k


@pytest.mark.parametrize(("skip", "whole", "output_text"), [
    (True, "\u00e9, we", "\u00e9, we"),
    (False, "\ufffd</s>\ufffd, we", "\ufffd, we"),
])
def test_a_special_token_inside_a_character_splits_it_only_where_it_is_written(
        byte_fallback_tokenizer, skip, whole, output_text):
    """The prompt ends with "\u00e9"'s first byte, then </s>: skipped, </s> lets the bytes join;
    written, it ends the prompt's text, and the byte after it is the output's U+FFFD."""
    tok = byte_fallback_tokenizer
    ids = tok.encode("\u00e9, we", add_special_tokens=False)
    assert [tok.id_to_token(t) for t in ids[:3]] == [SP, "<0xC3>", "<0xA9>"]
    prompt, output = [*ids[:2], tok.eos_token_id], ids[2:]
    assert tok.decode(prompt + output, skip) == whole
    assert shown(tok, prompt, output, skip) == reference(tok, prompt, output, skip) == output_text


@pytest.mark.parametrize("text", ["hello \U0001f916", "hello \u00e9\U0001f916", "\U0001f916\U0001f916"])
def test_a_reply_cut_inside_a_character_of_byte_tokens_ends_before_it(byte_fallback_tokenizer, text):
    """The last 🤖's four byte tokens, cut after one to three, at every prompt split (the prompt
    may hold some of them): the reply is its tokens' text up to the cut character, shown one token
    at a time and all at once alike."""
    tok = byte_fallback_tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    robot = len(ids) - 4
    assert [tok.id_to_token(t) for t in ids[robot:]] == ["<0xF0>", "<0x9F>", "<0xA4>", "<0x96>"]
    for cut in range(robot + 1, len(ids)):
        for k in range(cut):
            whole = min(k, robot)
            expected = reference(tok, ids[:whole], ids[whole:robot], True)
            assert "\ufffd" not in expected
            assert shown(tok, ids[:k], ids[k:cut]) == expected, (cut, k)
            at_once = IncrementalDetokenizer(tok, ids[:k], []).add(ids[k:cut], finished=True)
            assert at_once == (expected, None), (cut, k)


def test_the_reported_cut_replies(byte_fallback_tokenizer):
    tok = byte_fallback_tokenizer
    hello, f0, x9f = (tok.backend.token_to_id(e) for e in (f"{SP}hello", "<0xF0>", "<0x9F>"))
    assert tok.decode([hello, hello, f0, x9f]) == "hello hello\ufffd\ufffd"
    assert shown(tok, [hello], [hello, f0, x9f]) == " hello"
    assert shown(tok, [hello, f0], [x9f]) == ""


@pytest.mark.parametrize(("skip", "kept", "output_text"), [
    (True, 1, " hello"),
    (False, 4, " hello\ufffd</s>\ufffd"),
])
def test_a_special_token_inside_a_cut_character_ends_it_only_where_it_is_written(
        byte_fallback_tokenizer, skip, kept, output_text):
    """The reply is " hello", 🤖's first byte, </s>, its second: skipped, </s> leaves the
    character cut, and the reply is " hello"; written, it ends the first byte, the second is a
    stray byte, and the reply is all its tokens decode to."""
    tok = byte_fallback_tokenizer
    hello, f0, x9f = (tok.backend.token_to_id(e) for e in (f"{SP}hello", "<0xF0>", "<0x9F>"))
    output = [hello, f0, tok.eos_token_id, x9f]
    assert reference(tok, [hello], output[:kept], skip) == output_text
    assert shown(tok, [hello], output, skip) == output_text


def robot_and_hello(tokenizer: TextTokenizer) -> tuple[list[int], list[int], int]:
    """"a", 🤖's tokens, " hello"; the prompt splits that end inside 🤖; the end-of-text token."""
    ids = tokenizer.encode("a\U0001f916 hello", add_special_tokens=False)
    splits = [k for k in range(len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert tokenizer.decode(ids[:splits[-1] + 1]) == "a\U0001f916"
    return ids, splits, tokenizer.eos_token_id


@pytest.mark.parametrize("tokenizer_name", ["embedded_tokenizer", "byte_fallback_tokenizer"])
def test_a_prompt_cut_inside_a_character_keeps_it_when_the_output_goes_on_otherwise(request, tokenizer_name):
    """The prompt is "a" and some of 🤖's tokens, the output " hello": " hello", one token at a
    time and all at once, finished or not, with no U+FFFD for the prompt's bytes."""
    tok = request.getfixturevalue(tokenizer_name)
    ids, splits, _ = robot_and_hello(tok)
    hello = ids[splits[-1] + 1:]
    assert len(splits) == {"embedded_tokenizer": 2, "byte_fallback_tokenizer": 3}[tokenizer_name]
    for k in splits:
        assert shown(tok, ids[:k], hello) == reference(tok, ids[:k], hello, True) == " hello", k
        for finished in (False, True):
            at_once = IncrementalDetokenizer(tok, ids[:k], []).add(hello, finished=finished)
            assert at_once == (" hello", None), (k, finished)


@pytest.mark.parametrize("tokenizer_name", ["embedded_tokenizer", "byte_fallback_tokenizer"])
def test_a_special_token_between_a_prompt_cut_inside_a_character_and_the_output(request, tokenizer_name):
    """The end-of-text token skipped writes nothing: the token after it goes on with 🤖 or not;
    written out, it ends the prompt's character, which stays the prompt's."""
    tok = request.getfixturevalue(tokenizer_name)
    ids, splits, eos = robot_and_hello(tok)
    k, hello = splits[-1], ids[splits[-1] + 1:]
    cases = [([eos, *ids[k:]], True, "\U0001f916 hello"), ([eos, *hello], True, " hello"),
             ([eos, *hello], False, tok.decode([eos], False) + " hello")]
    for output, skip, expected in cases:
        assert shown(tok, ids[:k], output, skip) == reference(tok, ids[:k], output, skip) == expected


@pytest.mark.parametrize("tokenizer_name", ["embedded_tokenizer", "byte_fallback_tokenizer"])
def test_a_reply_that_goes_on_with_the_prompts_character_and_is_cut_shows_nothing(request, tokenizer_name):
    """The prompt ends inside 🤖, the reply holds more of its bytes but not the last: the cut
    character is dropped, prompt bytes and all."""
    tok = request.getfixturevalue(tokenizer_name)
    ids, splits, _ = robot_and_hello(tok)
    for k in splits:
        for cut in range(k + 1, splits[-1] + 1):
            assert shown(tok, ids[:k], ids[k:cut]) == "", (k, cut)
            assert IncrementalDetokenizer(tok, ids[:k], []).add(ids[k:cut], finished=True) == ("", None)
