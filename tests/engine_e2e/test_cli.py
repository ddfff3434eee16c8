"""`inferlab generate` and `inferlab chat` end to end: the flags reach the engine's config, and
what they print is what the LLM API generates for the same request."""

from __future__ import annotations

import io

import pytest

import inferlab.engine.llm_engine as llm_engine
from inferlab.cli import main
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InvalidParameterError

ENGINE_FLAGS = ["--dtype", "float32", "--block-size", "32", "--max-num-seqs", "3",
                "--max-num-batched-tokens", "64", "--max-model-len", "512",
                "--no-enable-prefix-caching", "--kv-cache-memory", "32MiB", "--num-threads", "2",
                "--scheduling-policy", "priority"]


@pytest.fixture
def configs(monkeypatch, smollm_fp32) -> list:
    """The EngineConfig each CLI engine is built with; the engines reuse the loaded model."""
    seen = []
    real_init = llm_engine.LLMEngine.__init__

    def init(self, config, loaded=None):
        seen.append(config)
        real_init(self, config, smollm_fp32)

    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", init)
    return seen


def _check_engine_flags(config) -> None:
    assert (config.dtype, config.block_size, config.max_num_seqs, config.max_num_batched_tokens,
            config.max_model_len, config.enable_prefix_caching, config.kv_cache_memory_bytes,
            config.num_threads, config.scheduling_policy) == (
        "float32", 32, 3, 64, 512, False, 32 * 2**20, 2, "priority")


def test_generate_prints_the_greedy_completion(capsys, configs, make_llm):
    prompt = "The capital of France is"
    assert main(["generate", prompt, "--max-tokens", "12", *ENGINE_FLAGS]) == 0
    _check_engine_flags(configs[0])
    expected = make_llm().generate([prompt], SamplingParams(temperature=0, max_tokens=12))[0]
    assert capsys.readouterr().out == expected.outputs[0].text + "\n"


def test_generate_takes_stop_strings_and_penalties(capsys, configs, make_llm):
    """llama-cli's -r / --repeat-penalty / --min-p, as vLLM names them: the text the LLM API
    gives for the same request."""
    prompt = "1, 2, 3, 4,"
    flags = ["--max-tokens", "16", "--repetition-penalty", "1.3", "--presence-penalty", "0.5",
             "--frequency-penalty", "0.2", "--min-p", "0.05", "--stop", "9", "--stop", "zz"]
    assert main(["generate", prompt, *flags, *ENGINE_FLAGS]) == 0
    params = SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3, presence_penalty=0.5,
                            frequency_penalty=0.2, min_p=0.05, stop=["9", "zz"])
    expected = make_llm().generate([prompt], params)[0].outputs[0]
    plain = make_llm().generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    assert expected.text != plain.text  # the flags change the reply: they are not ignored
    assert capsys.readouterr().out == expected.text + "\n"


def test_chat_repl_keeps_the_conversation(capsys, monkeypatch, configs, make_llm):
    """Two turns typed on stdin, then /exit: the second reply is the LLM's answer to the whole
    conversation, the first reply included."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Name a colour.\nAnd another one?\n/exit\n"))
    assert main(["chat", "--system", "Be brief.", "--max-tokens", "10", *ENGINE_FLAGS]) == 0
    _check_engine_flags(configs[0])
    llm = make_llm()
    params = SamplingParams(temperature=0, max_tokens=10)
    conversation = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Name a colour."}]
    first = llm.chat(conversation, params)[0].outputs[0].text
    conversation += [{"role": "assistant", "content": first},
                     {"role": "user", "content": "And another one?"}]
    second = llm.chat(conversation, params)[0].outputs[0].text
    assert capsys.readouterr().out == f"> {first}\n> {second}\n> "


def test_chat_repl_skips_empty_lines_and_takes_its_commands(capsys, monkeypatch, configs, make_llm):
    """Empty lines and /commands never reach the model (they were sent as user turns and kept
    in the history); /clear forgets the conversation but the system message."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Name a colour.\n\n   \n/help\n/clear\nAnd a fruit?\n/exit\n"))
    assert main(["chat", "--system", "Be brief.", "--max-tokens", "6", *ENGINE_FLAGS]) == 0
    llm = make_llm()
    params = SamplingParams(temperature=0, max_tokens=6)
    system = {"role": "system", "content": "Be brief."}
    first = llm.chat([system, {"role": "user", "content": "Name a colour."}], params, use_tqdm=False)[0].outputs[0].text
    second = llm.chat([system, {"role": "user", "content": "And a fruit?"}], params, use_tqdm=False)[0].outputs[0].text
    out, err = capsys.readouterr()
    assert out == f"> {first}\n> > > > > {second}\n> "
    assert err == ("commands: /clear (forget the conversation), /exit or /quit\n"
                   "(the conversation is cleared)\n")


def test_chat_takes_a_chat_template(capsys, configs, make_llm, tmp_path):
    """As serve's --chat-template (the missing-template error told users to pass it, and chat
    had no such flag): the turn is rendered by the given template."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}A:")
    assert main(["chat", "--chat-template", str(template), "--message", "Hi.", "--max-tokens", "5",
                 *ENGINE_FLAGS]) == 0
    expected = make_llm().generate(["user: Hi.\nA:"], SamplingParams(temperature=0, max_tokens=5))
    assert capsys.readouterr().out == f"> Hi.\n{expected[0].outputs[0].text}\n"


def test_chat_repl_reports_a_turn_over_the_context_and_goes_on(capsys, monkeypatch, configs,
                                                               make_llm):
    """A message that makes the conversation too long for the context is refused as one error
    line and dropped; the next turn goes on from the conversation before it (once the REPL
    ended with exit code 2 and the rest of stdin unread). The exit code still says a turn
    failed."""
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi.\n" + "word " * 60 + "\nBye.\n/exit\n"))
    assert main(["chat", "--system", "Be brief.", "--max-tokens", "4", *ENGINE_FLAGS,
                 "--max-model-len", "64"]) == 2
    llm = make_llm()
    params = SamplingParams(temperature=0, max_tokens=4)
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
    first = llm.chat(conversation, params, use_tqdm=False)[0].outputs[0].text  # no bar on stderr
    conversation += [{"role": "assistant", "content": first}, {"role": "user", "content": "Bye."}]
    second = llm.chat(conversation, params, use_tqdm=False)[0].outputs[0].text
    out, err = capsys.readouterr()
    assert out == f"> {first}\n> > {second}\n> "
    assert err == "error: the prompt has 95 tokens, the context holds 64: no room for output\n"


def test_llm_chat_takes_a_template_and_its_variables(make_llm):
    """LLM.chat's chat_template and chat_template_kwargs, as vLLM's LLM.chat takes them: the
    prompt is the one the template writes, here by hand."""
    llm = make_llm()
    template = "{% for m in messages %}{{ m['content'] }}{% if loud %}!{% endif %} {% endfor %}"
    params = SamplingParams(temperature=0, max_tokens=4)
    conversation = [{"role": "user", "content": "Name a colour"}]
    chatted = llm.chat(conversation, params, chat_template=template,
                       chat_template_kwargs={"loud": True})[0]
    assert chatted.prompt_token_ids == llm.tokenizer.encode("Name a colour! ", add_special_tokens=False)
    assert chatted.prompt == "Name a colour! "  # the text the template wrote, as vLLM's output has it
    direct = llm.generate([chatted.prompt_token_ids], params)[0]
    assert chatted.outputs[0].token_ids == direct.outputs[0].token_ids
    # tools reach the template as its `tools`, as vLLM's LLM.chat gives them
    listing = "{% for t in tools %}{{ t.function.name }};{% endfor %}" + template
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    with_tools = llm.chat(conversation, params, chat_template=listing, tools=[tool])[0]
    assert with_tools.prompt_token_ids == llm.tokenizer.encode("get_time;Name a colour ",
                                                               add_special_tokens=False)


def test_llm_chat_takes_what_the_servers_chat_takes(make_llm):
    """Content as text parts or None, a prefilled reply to continue, and template variables the
    call itself sets: once TypeErrors from LLM.chat (the server took the first two)."""
    llm = make_llm()
    template = "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
    params = SamplingParams(temperature=0, max_tokens=2)

    def prompt(messages, **options) -> str:
        ids = llm.chat(messages, params, chat_template=template, **options)[0].prompt_token_ids
        return llm.tokenizer.decode(ids)

    parts = [{"type": "text", "text": "Name"}, {"type": "text", "text": "a colour"}]
    assert prompt([{"role": "user", "content": parts}]) == "user:Name\na colour|"
    assert prompt([{"role": "system", "content": None}, {"role": "user", "content": "Hi"}]) == \
        "system:|user:Hi|"
    prefilled = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}]
    assert prompt(prefilled, add_generation_prompt=False, continue_final_message=True) == \
        "user:Hi|assistant:Hello, I"
    with pytest.raises(InvalidParameterError, match="chat_template_kwargs cannot set add_generation_prompt"):
        llm.chat(prefilled, params, chat_template_kwargs={"add_generation_prompt": False})
    with pytest.raises(InvalidParameterError, match="content part type 'image_url' is not supported"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], params)


def test_generate_without_max_tokens_fills_a_short_context(capsys, configs, make_llm):
    """Its default of 256 tokens once made every prompt in a context of 256 or fewer positions
    an error ("prompt + max_tokens over max_model_len")."""
    prompt = "The capital of France is"  # 5 tokens
    flags = [flag if flag != "512" else "12" for flag in ENGINE_FLAGS]  # --max-model-len 12
    assert main(["generate", prompt, *flags]) == 0
    expected = make_llm(max_model_len=12).generate([prompt], SamplingParams(temperature=0, max_tokens=7))[0]
    assert expected.outputs[0].finish_reason == "length"  # the context's 12 positions all used
    assert capsys.readouterr().out == expected.outputs[0].text + "\n"
