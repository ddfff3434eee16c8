"""Runs with file data and a tokenizer: what reaches the server, and the token cross-check."""

from __future__ import annotations

import json

from bench_helpers import bench_config, run


def test_jsonl_chat_run_sends_each_prompt_verbatim(mock_server, corpus, tmp_path,
                                                      tokenizer_json):
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": text}],
                                          "output_tokens": 6})
                              for text in ("one two three", "four five")) + "\n")
    url = mock_server()
    config = bench_config(url, corpus, "constant", (10.0,), max_seconds=1.0, chat=True,
                          data=str(data), tokenizer=str(tokenizer_json))
    result = run(config)
    (stage,) = result.stages
    ok = [r for r in stage.records if r.outcome == "ok"]
    assert len(ok) == 10
    # the mock counts prompt words: the record's words, as guidellm sends them (no tag)
    assert sorted({r.prompt_tokens for r in ok}) == [2, 3]
    assert {r.output_tokens for r in ok} == {6}
    assert {r.tokenizer_output_tokens for r in ok} == {6}  # " the of and ..." one token each
    assert not any("disagree" in w for w in result.warnings)
    assert not any("ignore_eos" in w for w in result.warnings)


def test_tokenizer_disagreement_is_a_warning(mock_server, corpus, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    # a byte-level tokenizer with no merges: " the" is four tokens, not one
    tokenizer = Tokenizer(models.BPE(vocab={chr(b): b for b in range(33, 127)} | {"Ġ": 127},
                                     merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    path = tmp_path / "bytes.json"
    tokenizer.save(str(path))
    url = mock_server()
    result = run(bench_config(url, corpus, "constant", (10.0,), max_seconds=0.5,
                              tokenizer=str(path)))
    assert any("disagree on output tokens" in w for w in result.warnings), result.warnings
