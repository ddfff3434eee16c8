"""Data: synthetic prompts cut from text, files of prompts, request bodies and their tags."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from inferlab.bench import dataspec
from inferlab.bench.datasets import Prompt, load_file
from inferlab.bench.dataspec import LengthDist, SyntheticSpec, is_synthetic, resolve_corpus
from inferlab.bench.synthetic import TAG_TOKENS_RESERVED, TextSource, synthetic_prompts
from inferlab.bench.templates import BodyOptions, make_template, request_tag
from inferlab.bench.tokens import TokenCounter
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


def test_length_distribution_respects_its_bounds():
    dist = LengthDist(100, 50.0, 80, 120)
    rng = random.Random(0)
    values = [dist.sample(rng) for _ in range(2000)]
    assert min(values) == 80 and max(values) == 120  # the clip is reached on both sides
    assert LengthDist(5).sample(rng) == 5


def test_exact_prompt_lengths_with_a_tokenizer(corpus, tokenizer_json):
    counter = TokenCounter(tokenizer_json)
    spec = SyntheticSpec.parse("prompt_tokens=64,output_tokens=8")
    prompts = synthetic_prompts(spec, TextSource(corpus, counter), 20, chat=False, seed=1)
    for p in prompts:
        body_tokens = counter.count(p.text)
        # decode/re-encode of a token slice can merge at most a token or two at the edges
        assert abs(body_tokens - (64 - TAG_TOKENS_RESERVED)) <= 2
        assert p.prompt_tokens == body_tokens + TAG_TOKENS_RESERVED
        assert p.output_tokens == 8
    assert len({p.text for p in prompts}) == 20  # every prompt cut from a different place


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
        assert body["prompt"].startswith(prefix + f"[abc-0-{i}] ")
        assert body["max_tokens"] == 4 and body["ignore_eos"] is True
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_chat_templates_tag_the_user_message():
    prompt = Prompt(None, ({"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Why is the sky blue?"}), 12, 16)
    options = BodyOptions("m", chat=True, force_length=False, continuous_usage=True,
                          extra=(("temperature", 0),))
    body = json.loads(make_template(prompt, options).body(request_tag("n", 1, 7)))
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][1]["content"] == "[n-1-7] Why is the sky blue?"
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
    assert (first.text, first.output_tokens, first.prompt_tokens) == ("one two three", 5, 4)
    assert second.messages == ({"role": "user", "content": "hi there"},)
    assert second.output_tokens == 9


@pytest.mark.parametrize("line, message", [
    ("not json", "prompts.jsonl:1: not JSON"),
    ('{"text": "x"}', "needs a 'prompt' string"),
    ('{"prompt": "x", "output_tokens": 0}', "positive int"),
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
    text = tmp_path / "prompts.txt"
    text.write_text("x\n")
    with pytest.raises(InferlabError, match=r"\.jsonl .* or \.json"):
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


def test_bad_tokenizer_file_is_a_user_error(tmp_path):
    with pytest.raises(InferlabError, match="tokenizer file not found"):
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
