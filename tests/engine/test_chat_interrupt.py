"""Ctrl-C during a reply in `inferlab chat` stops that reply and returns to the prompt, as
llama.cpp's interactive mode and `ollama run` do: the request is aborted (its KV blocks free
again) and the turn dropped; Ctrl-C at the prompt still ends the session. It once ended the
session, the conversation lost. The interrupt is raised from inside the model's forward, where a
real Ctrl-C mostly lands."""

from __future__ import annotations

import io
import json

import pytest

import inferlab.engine.cli as engine_cli
from inferlab.cli import main
from inferlab.engine.model_runner import ModelRunner
from tests.models.tiny_tokenizer import save_tiny_llama

# each message's words, one per line: the prompt shows which messages the model was given
TEMPLATE = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
FLAGS = ["--dtype", "float32", "--max-tokens", "3", "--kv-cache-memory", "1MiB"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("chat-interrupt")
    save_tiny_llama(directory)
    config = directory / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": TEMPLATE}))
    return str(directory)


@pytest.fixture
def session(monkeypatch) -> dict:
    """What the CLI's engine saw: its prompts, and whether anything still ran or held blocks
    when each was made. The first forward is interrupted."""
    seen: dict = {"prompts": [], "busy": [], "engine": None, "forwards": 0}
    real_engine, real_execute = engine_cli._engine, ModelRunner.execute

    def engine(args):
        seen["engine"] = made = real_engine(args)
        real_template = made.tokenizer.apply_chat_template

        def template(messages, **kwargs):
            bm = made.scheduler.block_manager
            seen["busy"].append((made.has_unfinished_requests(), bm.num_blocks - bm.num_free_blocks))
            seen["prompts"].append(real_template(messages, **kwargs))
            return seen["prompts"][-1]

        made.tokenizer.apply_chat_template = template
        return made

    def execute(self, sched):
        seen["forwards"] += 1
        if seen["forwards"] == 1:
            raise KeyboardInterrupt
        return real_execute(self, sched)

    monkeypatch.setattr(engine_cli, "_engine", engine)
    monkeypatch.setattr(ModelRunner, "execute", execute)
    return seen


def test_ctrl_c_during_a_reply_drops_the_turn_and_the_session_goes_on(model_dir, session,
                                                                      monkeypatch, capsys):
    """Dropped rather than kept cut short: the next turns would read a cut reply as the
    model's whole answer."""
    monkeypatch.setattr("sys.stdin", io.StringIO("w2 w3\nw4 w5\n/exit\n"))
    assert main(["chat", model_dir, *FLAGS]) == 0
    # the second turn's prompt has the second message alone, and was made with nothing left
    # running and every KV block free
    assert session["prompts"] == ["user w2 w3\n", "user w4 w5\n"]
    assert session["busy"] == [(False, 0), (False, 0)]
    engine = session["engine"]
    assert not engine.has_unfinished_requests() and session["forwards"] > 1
    out, err = capsys.readouterr()
    assert out.startswith("> \n> ") and out.endswith("\n> ")  # the cut line ends; prompts follow
    assert err == "(stopped: the turn is dropped)\n"


def test_ctrl_c_at_the_prompt_still_ends_the_session(model_dir, session, monkeypatch):
    def interrupted(prompt=""):
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupted)
    assert main(["chat", model_dir, *FLAGS]) == 130
    assert session["prompts"] == []


def test_ctrl_c_in_a_scripted_chat_ends_it(model_dir, session, capsys):
    """With --message there is no prompt to return to: the script stops, the second message
    unsent, and the request is aborted all the same."""
    assert main(["chat", model_dir, "--message", "w2", "--message", "w3", *FLAGS]) == 130
    assert session["prompts"] == ["user w2\n"]
    assert not session["engine"].has_unfinished_requests()
    assert capsys.readouterr().out == "> w2\n\n"


# stdin's ends: bytes that are not UTF-8, a closed stdin, Ctrl-D


def test_a_line_that_is_not_utf8_is_refused_and_the_session_goes_on(model_dir, monkeypatch, capsys):
    """Read strictly (as under most locales, not C.UTF-8) the byte 0xff was a traceback that
    lost the lines read with it; the REPL reads stdin keeping such bytes, and refuses the line."""
    strict = io.TextIOWrapper(io.BytesIO(b"w2 w3\n\xff w4\nw4 w5\n"), encoding="utf-8", errors="strict")
    monkeypatch.setattr("sys.stdin", strict)
    assert main(["chat", model_dir, *FLAGS]) == 2  # a turn was refused
    out, err = capsys.readouterr()
    assert err == "error: the message is not valid UTF-8 (at character 0)\n"
    assert out.count("> ") == 4  # three lines read, then the end


def test_a_closed_stdin_is_a_one_line_error(model_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", None)  # what Python makes of `<&-`
    assert main(["chat", model_dir, *FLAGS]) == 2
    assert capsys.readouterr().err == ("error: stdin is closed: nothing to read the conversation "
                                       "from (use --message)\n")


def test_ctrl_d_at_the_prompt_ends_the_line(model_dir, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", model_dir, *FLAGS]) == 0
    assert capsys.readouterr().out == "> \n"  # the shell's prompt on a line of its own
