"""Data: synthetic prompts cut from text, files of prompts, request bodies and their tags."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from inferlab.bench import dataspec
from inferlab.bench.config import DataConfig
from inferlab.bench.datasets import Prompt, load_file
from inferlab.bench.dataspec import LengthDist, SyntheticSpec, is_synthetic, resolve_corpus
from inferlab.bench.synthetic import TextSource, synthetic_prompts, tag_tokens
from inferlab.bench.tags import request_tag
from inferlab.bench.templates import BodyOptions, make_template
from inferlab.bench.tokens import TokenCounter
from inferlab.bench.workload import pool_size
from inferlab.errors import InferlabError


def test_synthetic_spec_parsing():
    spec = SyntheticSpec.parse("prompt_tokens=256,output_tokens=128,prompt_tokens_stdev=16,"
                               "prompt_tokens_min=200,output_tokens_max=130,prefix_tokens=64")
    assert spec.prompt == LengthDist(256, 16.0, 200, None)
    assert spec.output == LengthDist(128, 0.0, None, 130)
    assert spec.prefix_tokens == 64
    for bad, message in [("prompt_tokens=5", "output_tokens"), ("prompt_tokens=5,x=1", "unknown"),
                         ("prompt_tokens=a,output_tokens=1", "bad --data value")]:
        with pytest.raises(InferlabError, match=message):
            SyntheticSpec.parse(bad)


def test_huge_lengths_are_refused_when_parsed():
    # 1e10 tokens would be cut as a list of 7.5e9 words: memory runs out before any error
    with pytest.raises(InferlabError, match=r"^--data prompt_tokens must be at most "
                                            r"1,048,576 tokens, got 1e10$"):
        SyntheticSpec.parse("prompt_tokens=1e10,output_tokens=3")
    with pytest.raises(InferlabError, match="prompt_tokens_stdev must be at most"):
        SyntheticSpec.parse("prompt_tokens=8,output_tokens=3,prompt_tokens_stdev=2e6")
    at_bound = SyntheticSpec.parse("prompt_tokens=1048576,output_tokens=3,"
                                   "prompt_tokens_stdev=1048576")
    rng = random.Random(0)
    assert max(at_bound.prompt.sample(rng) for _ in range(100)) == 1_048_576  # clipped


def test_long_prompts_make_a_smaller_pool():
    def pool(data: str, max_requests: int | None = None) -> int:
        return pool_size(SyntheticSpec.parse(data), max_requests)

    assert pool("prompt_tokens=256,output_tokens=8") == 512
    assert pool("prompt_tokens=256,output_tokens=8", max_requests=3) == 3
    # 2^24 tokens in all: 16 prompts of 2^20; 32 of 2^18 unique after a 2^18 prefix
    assert pool("prompt_tokens=1048576,output_tokens=8") == 16
    assert pool("prompt_tokens=262144,prefix_tokens=262144,output_tokens=8") == 32


def test_length_distribution_respects_its_bounds():
    dist = LengthDist(100, 50.0, 80, 120)
    rng = random.Random(0)
    values = [dist.sample(rng) for _ in range(2000)]
    assert min(values) == 80 and max(values) == 120  # the clip is reached on both sides
    assert LengthDist(5).sample(rng) == 5


def sent_prompt_tokens(counter: TokenCounter, prompt: Prompt, tag: str) -> int:
    """What the tokenizer counts in the prompt a request carries, its tag put in."""
    body = make_template(prompt, BodyOptions("m", chat=False, force_length=True)).body(tag)
    return counter.count(json.loads(body)["prompt"])


# tags of other runs, stages and requests: the tag's digits differ, its cost must not
TAGS = [request_tag("000000", 0, 0), request_tag("739251", 3, 41),
        request_tag("999999", 12, 987654)]


def test_exact_prompt_lengths_with_a_tokenizer(corpus, tokenizer_json):
    counter = TokenCounter(tokenizer_json)
    # this tokenizer, which never saw a digit, splits the tag "[0000041-03-739251] " into 19
    # one-character tokens and a space that joins the next word (a guess of 8 fell short)
    assert tag_tokens(counter) == 19
    spec = SyntheticSpec.parse("prompt_tokens=64,output_tokens=8")
    prompts = synthetic_prompts(spec, TextSource(corpus, counter), 20, chat=False, seed=1)
    for p in prompts:
        assert p.prompt_tokens == 64 and p.output_tokens == 8
        assert [sent_prompt_tokens(counter, p, tag) for tag in TAGS] == [64, 64, 64]
    assert len({p.text for p in prompts}) == 20  # every prompt cut from a different place


def test_exact_lengths_count_the_shared_prefix_and_reach_the_shortest_possible(corpus,
                                                                               tokenizer_json):
    counter = TokenCounter(tokenizer_json)
    spec = SyntheticSpec.parse("prompt_tokens=40,output_tokens=4,prefix_tokens=32")
    prompts = synthetic_prompts(spec, TextSource(corpus, counter), 5, chat=False, seed=2)
    (prefix,) = {p.text[:p.tag_at] for p in prompts}
    assert counter.count(prefix.rstrip()) == 32  # its last space joins the tag's "["
    for p in prompts:
        assert p.prompt_tokens == 72
        assert [sent_prompt_tokens(counter, p, tag) for tag in TAGS] == [72, 72, 72]
    # the tag's 19 tokens and one of text is the least a prompt can be; less is refused
    (shortest,) = synthetic_prompts(SyntheticSpec.parse("prompt_tokens=20,output_tokens=1"),
                                    TextSource(corpus, counter), 1, chat=False, seed=0)
    assert sent_prompt_tokens(counter, shortest, TAGS[1]) == 20
    with pytest.raises(InferlabError, match="a prompt of 19 tokens .* needs at least 20"):
        synthetic_prompts(SyntheticSpec.parse("prompt_tokens=19,output_tokens=1"),
                          TextSource(corpus, counter), 1, chat=False, seed=0)


def test_tags_differ_in_their_first_cache_block(tokenizer_json):
    # a prefix cache reuses whole blocks of 16 tokens: if the tags of two requests agreed
    # on their first 16 tokens, the second would find its first block cached
    counter = TokenCounter(tokenizer_json)
    firsts = {tuple(counter.encode(request_tag("123456", stage, index))[:16])
              for stage in (0, 1) for index in range(300)}
    assert len(firsts) == 600


def test_a_tokenizer_that_merges_digits_is_flagged(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    # bytes, plus one merge: "99" is one token, so "[999999-99-9999999]" costs 11, not 19
    vocab = {chr(b): b for b in range(33, 127)} | {"Ġ": 127, "99": 128}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[("9", "9")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    path = tmp_path / "merging.json"
    tokenizer.save(str(path))
    assert tag_tokens(TokenCounter(path)) is None


def test_shared_prefix_then_tag_then_unique_text(corpus):
    spec = SyntheticSpec.parse("prompt_tokens=40,output_tokens=4,prefix_tokens=32")
    prompts = synthetic_prompts(spec, TextSource(corpus, TokenCounter(None)), 5, False, 0)
    prefixes = {p.text[:p.tag_at] for p in prompts}
    assert len(prefixes) == 1 and len(next(iter(prefixes)).split()) == 24  # 32 tokens * 0.75
    options = BodyOptions("m", chat=False, force_length=True)
    bodies = [json.loads(make_template(p, options).body(request_tag("abc", 0, i)))
              for i, p in enumerate(prompts)]
    for i, body in enumerate(bodies):
        prefix = prompts[i].text[:prompts[i].tag_at]
        assert body["prompt"].startswith(prefix + f"[{i:07d}-00-abc] ")
        assert body["max_tokens"] == 4 and body["ignore_eos"] is True
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_chat_templates_tag_the_user_message():
    prompt = Prompt(None, ({"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Why is the sky blue?"}), 12, 16,
                    tag_at=0)
    options = BodyOptions("m", chat=True, force_length=False, continuous_usage=True,
                          extra=(("temperature", 0),))
    body = json.loads(make_template(prompt, options).body(request_tag("n", 1, 7)))
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["content"] == "[0000007-01-n] Why is the sky blue?"
    assert "ignore_eos" not in body and body["temperature"] == 0
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_multi_message_records_need_the_chat_endpoint():
    prompt = Prompt(None, ({"role": "user", "content": "a"}, {"role": "user", "content": "b"}),
                    2, 4)
    with pytest.raises(InferlabError, match="--endpoint chat"):
        make_template(prompt, BodyOptions("m", chat=False, force_length=False))


def test_jsonl_records(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "one two three", "output_tokens": 5}\n\n'
                    '{"messages": [{"role": "user", "content": "hi there"}]}\n')
    first, second = load_file(str(path), TokenCounter(None), default_output_tokens=9)
    # 3 words are 4 tokens by the word rule; a file prompt is sent verbatim, with no tag
    assert (first.text, first.output_tokens, first.prompt_tokens) == ("one two three", 5, 4)
    assert second.messages == ({"role": "user", "content": "hi there"},)
    assert second.output_tokens == 9


@pytest.mark.parametrize("line, message", [
    ("not json", "prompts.jsonl:1: not valid JSON"),
    ('{"body": "x"}', "needs a prompt string"),
    ('{"prompt": "x", "output_tokens": -1}', "positive int"),
    ('{"messages": [{"role": "user"}]}', "'role' and 'content'"),
])
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(InferlabError, match=message):
        load_file(str(path), TokenCounter(None), 8)


def test_sharegpt_uses_first_turn_and_reply_length(tmp_path, tokenizer_json):
    counter = TokenCounter(tokenizer_json)
    data = [
        {"conversations": [{"from": "human", "value": "the river and the stone"},
                           {"from": "gpt", "value": "the garden of the market is north"}]},
        {"conversations": [{"from": "gpt", "value": "skipped: starts with the model"}]},
        {"conversations": [{"from": "human", "value": "only a question"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    (prompt,) = load_file(str(path), counter, 8)
    assert prompt.messages == ({"role": "user", "content": "the river and the stone"},)
    assert prompt.output_tokens == counter.count("the garden of the market is north")


def test_data_argument_kinds(tmp_path):
    assert is_synthetic("prompt_tokens=1,output_tokens=1")
    named = tmp_path / "a=b.jsonl"
    named.write_text('{"prompt": "x"}\n')
    assert not is_synthetic(str(named))  # an existing file wins over the spec syntax
    text = tmp_path / "prompts.yaml"
    text.write_text("x\n")
    with pytest.raises(InferlabError, match=r"must be \.jsonl, \.json .*\.csv or \.txt"):
        load_file(str(text), TokenCounter(None), 1)


def test_missing_default_corpus_asks_for_data_file(monkeypatch, tmp_path):
    monkeypatch.setattr(dataspec, "DEFAULT_CORPUS", tmp_path / "absent.raw")
    with pytest.raises(InferlabError, match="--data-file"):
        resolve_corpus(None)
    with pytest.raises(InferlabError, match="--data-file not found"):
        resolve_corpus(str(tmp_path / "nope.txt"))


def test_default_corpus_is_wikitext_beside_the_project():
    project_root = Path(__file__).resolve().parents[2]  # tests/bench/ -> the project
    expected = project_root.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"
    assert expected == dataspec.DEFAULT_CORPUS


def test_bad_tokenizer_file_is_a_user_error(tmp_path, monkeypatch):
    # named even where the default corpus is missing too, which once hid it
    monkeypatch.setattr(dataspec, "DEFAULT_CORPUS", tmp_path / "absent.raw")
    with pytest.raises(InferlabError, match="tokenizer file not found"):  # before any request
        DataConfig(tokenizer=str(tmp_path / "missing.json"))
    with pytest.raises(InferlabError, match="cannot load tokenizer"):
        TokenCounter(tmp_path / "missing.json")
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    with pytest.raises(InferlabError, match="cannot load tokenizer"):
        TokenCounter(broken)


def test_a_corpus_that_is_not_utf8_is_named(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(" ".join(["café"] * 200).encode("latin-1"))
    with pytest.raises(InferlabError, match=re.escape(f"{corpus}: not UTF-8 text")):
        TextSource(corpus, TokenCounter(None))
