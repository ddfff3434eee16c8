"""Where a model's chat template and the tokens it sees come from, as transformers 5 loads them;
what a template raises while rendering; --chat-template's inline escapes, as vLLM reads them.
The expected renderings are written out by hand from the files each test lays down."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest

from inferlab.engine.chat_prompt import chat_prompt_text
from inferlab.errors import InferlabError
from inferlab.models.chat_template import ChatTemplateError, load_chat_template
from inferlab.models.tokenizer import TextTokenizer, TokenizerInfo, load_hf_tokenizer
from tests.models.test_loader_errors import TOKENIZER, VOCAB, _gguf_tokenizer
from tests.models.tiny_tokenizer import make_tokenizer, save_tokenizer

HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f"}}]
DEFAULT = "DEFAULT {{ messages[0].content }}"
TOOL_USE = "TOOL_USE {{ tools | length }} {{ messages[0].content }}"


def _model_dir(directory: Path, files: dict[str, str], **config: object) -> str:
    """The tiny tokenizer in `directory`, its tokenizer_config.json holding `config`, and
    `files` (relative path: text) beside it."""
    save_tokenizer(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    for name, text in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text, encoding="utf-8")
    return str(directory)


@pytest.mark.parametrize("layout", ["named in tokenizer_config.json", "files"])
def test_a_tool_use_template_is_taken_when_tools_are_given(tmp_path, layout):
    """transformers' get_chat_template: "tool_use" where tools are given (an empty list
    too), else "default"; both as named templates in tokenizer_config.json and as
    chat_template.jinja beside additional_chat_templates/tool_use.jinja."""
    if layout == "files":
        model = _model_dir(tmp_path, {"chat_template.jinja": DEFAULT,
                                      "additional_chat_templates/tool_use.jinja": TOOL_USE,
                                      "additional_chat_templates/rag.jinja": "RAG"})
    else:
        model = _model_dir(tmp_path, {}, chat_template=[
            {"name": "default", "template": DEFAULT}, {"name": "tool_use", "template": TOOL_USE}])
    tokenizer = load_hf_tokenizer(model)
    assert chat_prompt_text(tokenizer, HI) == "DEFAULT hi"
    assert chat_prompt_text(tokenizer, HI, tools=[]) == "TOOL_USE 0 hi"
    assert chat_prompt_text(tokenizer, HI, tools=TOOLS) == "TOOL_USE 1 hi"
    # the server's --chat-template still comes first
    assert chat_prompt_text(tokenizer, HI, template="T", tools=TOOLS) == "T"


def test_tools_without_a_tool_use_template_take_the_default(tmp_path):
    tokenizer = load_hf_tokenizer(_model_dir(tmp_path, {}, chat_template=DEFAULT))
    assert chat_prompt_text(tokenizer, HI, tools=TOOLS) == "DEFAULT hi"


def test_a_gguf_tool_use_template_is_taken_when_tools_are_given(tmp_path):
    """llama.cpp's convert writes a named template as tokenizer.chat_template.NAME."""
    tokenizer = _gguf_tokenizer(tmp_path, {**TOKENIZER, "tokenizer.chat_template": DEFAULT,
                                           "tokenizer.chat_template.tool_use": TOOL_USE})
    assert chat_prompt_text(tokenizer, HI) == "DEFAULT hi"
    assert chat_prompt_text(tokenizer, HI, tools=TOOLS) == "TOOL_USE 1 hi"


@pytest.mark.parametrize("config_template", ["OLD {{ 1 }}", [{"name": "default", "template": "OLD"}]])
def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path, config_template):
    """In transformers the folder's template files replace tokenizer_config.json's; the config's
    once won, so a model updated with a new chat_template.jinja kept rendering its old one."""
    model = _model_dir(tmp_path, {"chat_template.jinja": DEFAULT}, chat_template=config_template)
    assert chat_prompt_text(load_hf_tokenizer(model), HI) == "DEFAULT hi"


def test_templates_see_every_named_special_token(tmp_path):
    """transformers renders with {**special_tokens_map, **kwargs}: the seven named tokens
    (an AddedToken's by its content) and the model-specific ones extra_special_tokens names;
    a token that is not set stays undefined, and a list of extra tokens names none. Only BOS
    and EOS were there before."""
    template = ("{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ sep_token }}|{{ pad_token }}|"
                "{{ cls_token }}|{{ mask_token }}|{{ image_token }}|"
                "{{ additional_special_tokens is defined }}")
    model = _model_dir(tmp_path, {}, chat_template=template, bos_token="<bos>", eos_token="</s>",
                       unk_token={"content": "<unk>", "special": True}, sep_token="w2",
                       pad_token="w3", cls_token="w4", mask_token="w5",
                       extra_special_tokens={"image_token": "w6"})
    assert chat_prompt_text(load_hf_tokenizer(model), HI) == "<bos>|</s>|<unk>|w2|w3|w4|w5|w6|False"
    model = _model_dir(tmp_path, {}, chat_template="{{ sep_token is defined }}|{{ image_token "
                       "is defined }}", unk_token="<unk>", extra_special_tokens=["w6"])
    assert chat_prompt_text(load_hf_tokenizer(model), HI) == "False|False"


def test_chat_template_kwargs_set_the_other_special_tokens_as_transformers_lets_them(tmp_path):
    model = _model_dir(tmp_path, {}, chat_template="{{ unk_token }}|{{ pad_token }}",
                       unk_token="<unk>", pad_token="w3")
    assert chat_prompt_text(load_hf_tokenizer(model), HI,
                            template_kwargs={"unk_token": "?"}) == "?|w3"


def test_a_gguf_files_unknown_and_padding_tokens_reach_the_template(tmp_path):
    """The two transformers reads from GGUF metadata besides BOS and EOS."""
    tokenizer = _gguf_tokenizer(tmp_path, {
        **TOKENIZER, "tokenizer.ggml.unknown_token_id": 6, "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.chat_template": "{{ unk_token }}|{{ pad_token }}|{{ sep_token is defined }}"})
    assert chat_prompt_text(tokenizer, HI) == f"{VOCAB[6]}|{VOCAB[2]}|False"


@pytest.mark.parametrize(("template", "variables", "words"), [
    # Llama 3.1's "Today Date: " + date_string, given a number
    ("{{ 'Today Date: ' + date_string }}", {"date_string": 5},
     'TypeError: can only concatenate str (not "int") to str'),
    ("{% for c in date_string %}{% endfor %}", {"date_string": 5},
     "TypeError: 'int' object is not iterable"),
    # `| items` on text, as on an earlier call's arguments that are no JSON ("{bad")
    ("{% for k, v in messages[0].content | items %}{% endfor %}", {},
     "TypeError: Can only get item pairs from a mapping."),
    ("{{ 10 / n }}", {"n": 0}, "ZeroDivisionError: division by zero"),
    ("{% macro loop() %}{{ loop() }}{% endmacro %}{{ loop() }}", {},
     "RecursionError: maximum recursion depth exceeded"),
    ("{{ raise_exception('roles must alternate') }}", {}, "roles must alternate"),
])
def test_what_a_template_raises_is_a_one_line_user_error(template, variables, words):
    """vLLM answers ValueError, TypeError, RuntimeError and Jinja's errors while rendering with
    a 400; only Jinja's were the user's error here, the rest an HTTP 500 and a traceback."""
    tokenizer = TextTokenizer(make_tokenizer(), TokenizerInfo(chat_template=template))
    with pytest.raises(ChatTemplateError) as raised:
        chat_prompt_text(tokenizer, [{"role": "user", "content": "{bad"}],
                         template_kwargs=variables)
    assert isinstance(raised.value, InferlabError)  # what the server answers with a 400
    message = str(raised.value)
    assert message.startswith(f"chat template: {words}") and "\n" not in message


@pytest.mark.parametrize("value", [r'{{ "a" }}\n{{ "b" }}', r"{{ 1 }}\t\x41\u0042\\n", "{{ 1 }}"])
def test_an_inline_chat_template_has_its_escapes_decoded_as_vllm_decodes_them(value):
    """vLLM's load_chat_template decodes a template given inline (not a file's path) with
    codecs.decode(value, "unicode_escape"), so that a shell's "\\n" is a line end."""
    assert load_chat_template(value) == codecs.decode(value, "unicode_escape")


def test_an_inline_chat_template_keeps_characters_beyond_ascii():
    """Where vLLM's codec reads their UTF-8 bytes as Latin-1 ("é" as "Ã©")."""
    assert load_chat_template(r'{{ "café 日本" }}\n') == '{{ "café 日本" }}\n'


def test_a_chat_template_file_is_read_as_it_is(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text(r'{{ "a\nb" }}', encoding="utf-8")
    assert load_chat_template(str(path)) == r'{{ "a\nb" }}'


@pytest.mark.parametrize(("value", "words"), [
    ("{{ 1 }}\\", "\\ at end of string"), ("{{ 1 }}\\u12", "truncated \\uXXXX escape")])
def test_an_inline_chat_template_with_a_broken_escape_is_a_one_line_error(value, words):
    with pytest.raises(InferlabError) as raised:
        load_chat_template(value)
    assert str(raised.value) == f"chat template: its escapes cannot be decoded ({words})"
