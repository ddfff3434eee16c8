"""Chat templates rendered in a sandboxed Jinja environment, as transformers renders them."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferlab.errors import InferlabError
from inferlab.user_files import read_user_text

# what a template's own code raises on a conversation or variables it cannot take (an int where
# it iterates, `| items` on text, a macro that recurses forever): vLLM answers these with a 400
# too, as the input's fault, not the server's
_RENDER_ERRORS = (TemplateError, ArithmeticError, LookupError, RuntimeError, TypeError, ValueError)


class ChatTemplateError(InferlabError):
    """A chat template that fails on this conversation or these variables."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`, which marks the assistant's text for
    transformers' assistant-token masks: here its body renders as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=["jinja2.ext.loopcontrols", _Generation])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(template: str, variables: Mapping[str, Any]) -> str:
    """Render with `variables` (messages, add_generation_prompt and the rest), given as one
    mapping so that no name of theirs can clash with a parameter; what the template raises (e.g.
    roles out of order) is the user's error."""
    try:
        return _compile(template).render(variables)
    except _RENDER_ERRORS as e:
        raise ChatTemplateError(f"chat template: {_error_text(e)}") from None


def _error_text(error: Exception) -> str:
    """raise_exception's message as the template wrote it; another error with its kind, which
    its message alone may not say (a KeyError's is just the key)."""
    return str(error) if isinstance(error, TemplateError) else f"{type(error).__name__}: {error}"


def read_template_file(path: str) -> str:
    """A Jinja file's text, line ends as open() reads them (as transformers reads
    chat_template.jinja); a directory or a file that is not UTF-8 is a one-line error."""
    return read_user_text(path, "chat template file", as_lf=("\r\n", "\r"))


def load_chat_template(value: str) -> str:
    """vLLM's --chat-template: a file's path (read as it is) or the template itself, whose
    escapes ("\\n") are decoded as vLLM decodes them; checked now, so that a broken one fails at
    start rather than at the first chat request."""
    if os.path.isfile(value) or os.path.isdir(value):  # a folder: read_user_text says so
        template = read_template_file(value)
    elif "{{" not in value and "{%" not in value:
        raise InferlabError(f"chat template {value!r}: no such file, and not a Jinja template")
    else:
        template = _unescape(value)
    try:
        _compile(template)
    except TemplateError as e:
        raise InferlabError(f"chat template: {e}") from None
    return template


def _unescape(value: str) -> str:
    """Python's escapes in `value` decoded, as vLLM's codecs.decode(value, "unicode_escape")
    does, except that characters beyond ASCII stay as they are (vLLM's turn into mojibake: the
    codec reads their UTF-8 bytes as Latin-1)."""
    try:
        return value.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError as e:
        raise InferlabError(f"chat template: its escapes cannot be decoded ({e.reason})") from None
