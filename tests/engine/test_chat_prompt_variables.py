"""Chat prompts with the variables and messages transformers and vLLM take: chat_template_kwargs
under any name, tool calls whose arguments are already an object, and the `inferlab chat` REPL
going on past a turn its template refuses. The expected prompts are written out by hand."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

import inferlab.engine.cli as cli
from inferlab.cli import main
from inferlab.engine.chat_prompt import ChatError, chat_prompt_text
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo
from tests.models.tiny_tokenizer import make_tokenizer

HI = [{"role": "user", "content": "hi"}]
NO_DEFAULTS = SimpleNamespace(sampling={})  # an engine's generation defaults: the model sets none


def _fits(chars: int) -> None:
    """An engine's check_text_fits whose context holds any conversation."""


def _tokenizer(template: str = "") -> TextTokenizer:
    return TextTokenizer(make_tokenizer(), TokenizerInfo(bos_token="<bos>", eos_token="</s>",
                                                         chat_template=template or None))


@pytest.mark.parametrize("name", ["template", "variables", "documents", "unk_token"])
def test_chat_template_kwargs_of_any_name_reach_the_template(name):
    """The names of apply_chat_template's own parameters once clashed with them: a TypeError,
    an HTTP 500 on /v1/chat/completions and /tokenize."""
    text = chat_prompt_text(_tokenizer(), HI, template=f"[{{{{ {name} }}}}]",
                            template_kwargs={name: "x"})
    assert text == "[x]"


def test_a_chat_template_kwarg_named_self_is_no_error():
    """`self` was a TypeError too; Jinja keeps the name for the template itself, so the
    variable is taken and the template renders as it would without it."""
    assert chat_prompt_text(_tokenizer(), HI, template="[{{ messages[0].content }}]",
                            template_kwargs={"self": "x"}) == "[hi]"


@pytest.mark.parametrize("name", ["messages", "add_generation_prompt", "bos_token", "tools"])
def test_chat_template_kwargs_cannot_set_the_requests_own_fields(name):
    with pytest.raises(ChatError, match=f"cannot set {name}") as refused:
        chat_prompt_text(_tokenizer("{{ 1 }}"), HI, template_kwargs={name: "x"})
    assert refused.value.param == "chat_template_kwargs"


@pytest.mark.parametrize("arguments", [{"city": "Paris"}, {}, ["Paris"]])
def test_tool_call_arguments_given_as_an_object_reach_the_template_as_they_are(arguments):
    """transformers documents arguments as a dict, and vLLM keeps one as it is; json.loads of
    it was a TypeError in LLM.chat."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    conversation = [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}]
    template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                "{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}")
    expected = {"{'city': 'Paris'}": '{"city": "Paris"}', "{}": "{}", "['Paris']": '["Paris"]'}
    assert chat_prompt_text(_tokenizer(), conversation, add_generation_prompt=False,
                            template=template) == expected[str(arguments)]


# the conversation's contents, each followed by a space; a user's "w5" makes it refuse the turn
REFUSING_TEMPLATE = ("{% for m in messages %}{% if m.content == 'w5' %}{{ raise_exception("
                     "'no w5 here') }}{% endif %}{{ m.content }} {% endfor %}")


def test_chat_repl_reports_a_turn_its_template_refuses_and_goes_on(capsys, monkeypatch):
    """The template's error once ended the session (it was rendered outside the turn's error
    handling); now the turn is dropped and the next one goes on from the conversation before
    it. The exit code still says a turn failed."""
    tokenizer = _tokenizer(REFUSING_TEMPLATE)
    prompts = []

    def reply(engine, prompt_ids, params) -> SimpleNamespace:  # a RequestOutput's part chat reads
        prompts.append(prompt_ids)
        return SimpleNamespace(outputs=[SimpleNamespace(text="w9")])

    monkeypatch.setattr(cli, "_engine", lambda args: SimpleNamespace(tokenizer=tokenizer, generation=NO_DEFAULTS, check_text_fits=_fits))
    monkeypatch.setattr(cli, "_stream", reply)
    monkeypatch.setattr("sys.stdin", io.StringIO("w2\nw5\nw3\n/exit\n"))
    assert main(["chat"]) == 2
    assert prompts == [tokenizer.encode(text, add_special_tokens=False)
                       for text in ["w2 ", "w2 w9 w3 "]]
    assert capsys.readouterr().err == "error: chat template: no w5 here\n"


def test_chat_repl_without_a_chat_template_ends_at_once(capsys, monkeypatch):
    """No turn can work without a template: one error line, not one for each turn typed."""
    monkeypatch.setattr(cli, "_engine", lambda args: SimpleNamespace(tokenizer=_tokenizer(), generation=NO_DEFAULTS, check_text_fits=_fits))
    monkeypatch.setattr("sys.stdin", io.StringIO("w2\nw3\n/exit\n"))
    assert main(["chat"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: this model has no chat template") and err.count("\n") == 1
