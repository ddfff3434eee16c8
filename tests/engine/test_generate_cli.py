"""`inferlab generate` and `inferlab chat` with bad flags: one line on stderr, exit code 2, and no
model loaded first (the parameters are checked before it)."""

from __future__ import annotations

import pytest

from inferlab.cli import main


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize(("flags", "words"), [
    (["--max-tokens", "0"], "max_tokens must be at least 1"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--sampling-seed", str(2**70)], "seed must be in"),  # these once ended in a traceback
    (["--seed", str(-2**63 - 1)], "seed must be in"),
    (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must be in (0, 1]"),
    (["--block-size", "0"], "block_size must be a power of two"),  # once a ZeroDivisionError
    (["--num-threads", "100000"], "num_threads must be in [1, 1024]"),  # once a segfault
])
def test_bad_flags_are_one_line_errors(capsys, monkeypatch, command, flags, words):
    import inferlab.engine.llm_engine as llm_engine

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", _no_model)
    argv = [command, "hi", *flags] if command == "generate" else [command, "--message", "hi", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "words"), [
    (["generate", ""], "the prompt is empty"),
    (["generate", "caf\udce9"], "the prompt is not valid UTF-8 (at character 3)"),  # argv's bytes
    (["chat", "--system", "caf\udce9", "--message", "hi"], "--system is not valid UTF-8"),
    (["chat", "--message", "hi", "--message", "\udcff"], "--message is not valid UTF-8"),
])
def test_bad_text_is_refused_before_the_model_loads(capsys, monkeypatch, argv, words):
    """Once found only after loading; in chat every turn then failed on it."""
    import inferlab.engine.llm_engine as llm_engine

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", _no_model)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1


def test_cuda_asked_for_without_one_is_a_one_line_error(capsys, monkeypatch):
    """Once torch's AssertionError traceback, after the flags were taken."""
    import torch

    import inferlab.engine.llm_engine as llm_engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(llm_engine, "load_model", _no_model)
    assert main(["generate", "hi", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: device cuda:") and err.count("\n") == 1


def _no_model(*args) -> None:
    raise AssertionError("the model was loaded before the flags were checked")


@pytest.mark.parametrize("order", [["hi", "--max-tokens", "3", "MODEL"], ["--max-tokens", "3", "hi", "MODEL"],
                                   ["hi", "MODEL", "--max-tokens", "3"]])
def test_the_model_may_come_after_the_options(capsys, tmp_path, order):
    """Once "unrecognized arguments: MODEL" when it followed an option (argparse had passed
    over the optional positional by then): it reaches the loader wherever it stands."""
    missing = str(tmp_path / "no-such-model")
    assert main(["generate", *[missing if a == "MODEL" else a for a in order]]) == 2
    assert capsys.readouterr().err == f"error: {missing}: no such file or directory\n"


@pytest.mark.parametrize(("argv", "named"), [
    (["generate", "--", "-hello", "MODEL"], "MODEL"),  # a prompt that starts with '-'
    (["generate", "--", "--max-tokens", "MODEL"], "MODEL"),
    (["info", "--", "-MODEL"], "-MODEL"),  # a path that starts with '-'
])
def test_a_double_dash_ends_the_options(capsys, tmp_path, monkeypatch, argv, named):
    """What follows `--` is positional, as argparse reads it; intermixed parsing once dropped the
    `--` and read "-hello" as -h."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {named}: no such file or directory\n"


def test_generate_takes_the_models_max_new_tokens_as_its_default(tmp_path, capsys):
    """As --max-tokens's help says and LLM.generate does: the model's generation_config.json
    max_new_tokens, not the CLI's 256 (which filled the tiny model's context)."""
    import json

    from tests.models.tiny_tokenizer import save_tiny_llama

    model = save_tiny_llama(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3}))
    assert main(["generate", "w2 w3", model, "--dtype", "float32", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == " w3 w3 w3\n"  # the tiny model's greedy reply, one word a token


def test_a_model_given_before_the_prompt_names_the_order(capsys, monkeypatch, tmp_path):
    """`generate MODEL PROMPT`, the order of the other commands, once said only 'Hello: no such
    file or directory'."""
    import inferlab.engine.llm_engine as llm_engine

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", _no_model)
    assert main(["generate", str(tmp_path), "Hello"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: Hello: no such file or directory; the prompt comes first: "
                   "inferlab generate PROMPT [MODEL]\n")
