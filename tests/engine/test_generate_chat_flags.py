"""vLLM's sampling flags in `inferlab generate` (-n, --logprobs, --ignore-eos, --min-tokens),
vllm chat's -q/--quick, the engine flags vLLM reads as sizes, and the REPL's way out of a
conversation that has outgrown the context. On the tiny Llama, whose greedy reply repeats the
prompt's last word ("w2 w3" -> " w3 w3 w3"; its word-level tokenizer makes each word one token)."""

from __future__ import annotations

import io
import json
import re

import pytest

from inferlab.cli import main, parse_command_line
from inferlab.engine.args import engine_config_from_args
from inferlab.engine.sampling_params import SamplingParams
from tests.models.tiny_tokenizer import VOCAB, save_tiny_llama

FLAGS = ["--dtype", "float32", "--kv-cache-memory", "1MiB", "--temperature", "0"]
W3 = VOCAB["w3"]
# each message on a line of its own, after its role (a word outside the vocabulary: one token)
TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def w3_ends(tmp_path) -> str:
    """The tiny Llama whose generation_config.json makes w3, its greedy reply, an end token."""
    directory = save_tiny_llama(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": W3}))
    return directory


def test_n_prints_each_completion(model, capsys):
    assert main(["generate", "w2 w3", model, *FLAGS, "--max-tokens", "3", "-n", "2"]) == 0
    assert capsys.readouterr().out == ("--- completion 1 of 2\n w3 w3 w3\n"
                                       "--- completion 2 of 2\n w3 w3 w3\n")


def test_logprobs_are_the_engines_own(model, capsys):
    """After the streamed text, a line a token: the token, its logprob and rank, then the top 2,
    as the engine reports them for the same request."""
    from inferlab.engine.llm import LLM

    assert main(["generate", "w2 w3", model, *FLAGS, "--max-tokens", "3", "--logprobs", "2"]) == 0
    text, *table = capsys.readouterr().out.splitlines()
    assert text == " w3 w3 w3"
    llm = LLM(model, dtype="float32", kv_cache_memory_bytes=2**20)
    [completion] = llm.generate(["w2 w3"], SamplingParams(temperature=0, max_tokens=3, logprobs=2),
                                use_tqdm=False)[0].outputs
    word = {token_id: text for text, token_id in VOCAB.items()}
    line = re.compile(r"'(\w+)' (-?\d+\.\d{4}) \(rank (\d+)\)  top: '(\w+)' (-?\d+\.\d{4}), "
                      r"'([<>\w]+)' (-?\d+\.\d{4})")
    for row, entry in zip(table, completion.logprobs, strict=True):
        chosen, logprob, rank, first, first_lp, second, second_lp = line.fullmatch(row).groups()
        assert (chosen, int(rank)) == ("w3", entry.rank)
        assert float(logprob) == pytest.approx(entry.logprob, abs=5e-5)
        assert [(first, float(first_lp)), (second, float(second_lp))] == [
            (word[t], pytest.approx(lp, abs=5e-5)) for t, lp in entry.top]
    assert [(entry.token_id, entry.rank, len(entry.top)) for entry in completion.logprobs] == [(W3, 1, 2)] * 3


def test_ignore_eos_goes_on_to_max_tokens(w3_ends, capsys):
    assert main(["generate", "w2 w3", w3_ends, *FLAGS, "--max-tokens", "3"]) == 0
    assert capsys.readouterr().out == "\n"  # w3 ended it at once
    assert main(["generate", "w2 w3", w3_ends, *FLAGS, "--max-tokens", "3", "--ignore-eos"]) == 0
    assert capsys.readouterr().out == " w3 w3 w3\n"


def test_min_tokens_bars_eos_before_them(w3_ends, capsys):
    """The model's first choice, w3, ends the reply; before two tokens it is barred and the
    first token is its second choice. --logprobs 1 lists the tokens taken (the text skips
    <unk>, which the model takes then)."""
    assert main(["generate", "w2 w3", w3_ends, *FLAGS, "--max-tokens", "6", "--min-tokens", "2",
                 "--logprobs", "1"]) == 0
    first, second = capsys.readouterr().out.splitlines()[1:3]
    assert "(rank 2)  top: 'w3' " in first
    assert not first.startswith("'w3'") and not second.startswith("'w3'")


def test_min_tokens_over_the_default_max_tokens_raises_it(tmp_path, capsys):
    """--min-tokens 6 with no --max-tokens, where the model's default is 4: once refused after
    the load for a max_tokens (4) the user never gave; now it runs 6 tokens. Past the context it
    is refused for min_tokens, as a context error."""
    directory = save_tiny_llama(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": 4}))
    assert main(["generate", "w2 w3", directory, *FLAGS]) == 0
    assert capsys.readouterr().out == " w3" * 4 + "\n"
    assert main(["generate", "w2 w3", directory, *FLAGS, "--min-tokens", "6"]) == 0
    assert capsys.readouterr().out == " w3" * 6 + "\n"
    assert main(["generate", "w2 w3", directory, *FLAGS, "--min-tokens", "200"]) == 2
    err = capsys.readouterr().err
    assert "+ min_tokens (200) = " in err and "is over the context length 128" in err, err


@pytest.mark.parametrize("flag", ["-q", "--quick"])
def test_quick_is_vllm_chats_name_for_message(model, capsys, flag):
    assert main(["chat", model, *FLAGS, "--chat-template", TEMPLATE, "--max-tokens", "3",
                 flag, "w2 w3", flag, "w4"]) == 0
    assert capsys.readouterr().out == "> w2 w3\n w3 w3 w3\n> w4\n w4 w4 w4\n"


def test_a_conversation_over_the_context_says_that_clear_starts_over(model, capsys, monkeypatch):
    """Each later turn failed with the same error and no hint. The hint only where the message
    would be taken after /clear: not for a message too long alone. The first reply fills the
    context's room, 12 - 3 tokens ("user w2 w3"), so the second prompt has 3 + 10 + 3 tokens;
    the third message is 13 tokens alone."""
    long_message = " ".join(f"w{i}" for i in range(2, 14))
    monkeypatch.setattr("sys.stdin", io.StringIO(f"w2 w3\nw4 w5\n{long_message}\n/clear\nw4 w5\n/exit\n"))
    assert main(["chat", model, *FLAGS, "--chat-template", TEMPLATE, "--max-model-len", "12"]) == 2
    out, err = capsys.readouterr()
    assert out == f"> {' w3' * 9}\n> > > > {' w5' * 9}\n> "
    assert err == ("error: the prompt has 16 tokens, the context holds 12: no room for output "
                   "(/clear starts over)\n"
                   "error: the prompt has 26 tokens, the context holds 12: no room for output\n"
                   "(the conversation is cleared)\n")


def test_chat_help_gives_the_exit_status(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["chat", "--help"])
    assert exited.value.code == 0
    assert "exit status is then 2" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("flags", "field", "value"), [
    (["--max-num-batched-tokens", "8k"], "max_num_batched_tokens", 8000),  # once "invalid int value"
    (["--max-num-batched-tokens", "2K"], "max_num_batched_tokens", 2048),
    (["--kv-cache-memory-bytes", "1073741824"], "kv_cache_memory_bytes", 2**30),  # newer vLLM's name
    (["--kv-cache-memory-bytes", "512MiB"], "kv_cache_memory_bytes", 2**29),
])
def test_engine_flags_by_vllms_names_and_sizes(flags, field, value):
    for command in (["generate", "hi"], ["chat"], ["serve"]):
        config = engine_config_from_args(parse_command_line([*command, *flags]))
        assert getattr(config, field) == value

