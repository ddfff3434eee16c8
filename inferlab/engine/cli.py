"""`inferlab generate "prompt"` and `inferlab chat` (a streaming REPL)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys
from typing import TYPE_CHECKING

from inferlab.engine.args import add_engine_args, engine_config_from_args
from inferlab.engine.chat_prompt import chat_prompt_text
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.embedded import EMBEDDED_ALIAS

if TYPE_CHECKING:  # the engine (and torch) load only once the flags are checked
    from inferlab.engine.llm_engine import LLMEngine


def register(subparsers: argparse._SubParsersAction) -> None:
    gen = subparsers.add_parser("generate", help="complete one prompt and print the text")
    gen.add_argument("prompt")
    _add_sampling_args(gen)
    add_engine_args(gen)
    gen.set_defaults(func=run_generate)
    chat = subparsers.add_parser(
        "chat", help="chat with the model in the terminal (streaming)",
        description="Chat with the model in the terminal, its replies streamed. At the > prompt: "
                    "/clear forgets the conversation (the system message stays), /exit or /quit "
                    "or Ctrl-D ends the session; Ctrl-C stops a reply and drops the turn, and at "
                    "the prompt ends the session.")
    chat.add_argument("--system", "--system-prompt", dest="system", default=None,
                      help="system message (--system-prompt as vllm chat names it)")
    chat.add_argument("--chat-template", default=None,
                      help="a Jinja chat template file, or the template itself, instead of the "
                           "model's own (as serve's --chat-template)")
    chat.add_argument("--message", action="append", default=None,
                      help="send this user message and exit (repeatable); without it, a REPL")
    _add_sampling_args(chat)
    add_engine_args(chat)
    chat.set_defaults(func=run_chat)


DEFAULT_MAX_TOKENS = 256


def _add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="tokens to generate at most (default: the model's "
                             "generation_config.json max_new_tokens (see --generation-config), "
                             f"else {DEFAULT_MAX_TOKENS}; at most what the context has room for)")
    model = "the model's generation_config.json (see --generation-config), else"
    parser.add_argument("--temperature", type=float, default=None, help=f"default: {model} 0 (greedy)")
    parser.add_argument("--top-p", type=float, default=None, help=f"default: {model} 1")
    parser.add_argument("--top-k", type=int, default=None, help=f"default: {model} 0 (all)")
    parser.add_argument("--min-p", type=float, default=None, help=f"default: {model} 0")
    parser.add_argument("--repetition-penalty", type=float, default=None, help=f"default: {model} 1")
    parser.add_argument("--presence-penalty", type=float, default=None, help="default: 0")
    parser.add_argument("--frequency-penalty", type=float, default=None, help="default: 0")
    parser.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help="end the reply where TEXT appears, without it (repeatable)")
    parser.add_argument("--sampling-seed", type=int, default=None,
                        help="this command's own requests' seed (SamplingParams.seed; default: "
                             "none, the engine's --seed draws)")


_SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "stop")


def _sampling(args: argparse.Namespace, engine: LLMEngine | None = None) -> SamplingParams:
    """The flags given, over the engine's model's generation_config.json sampling fields (what
    --generation-config auto makes the defaults, as the server and LLM take them), over greedy.
    Without an engine, the flags alone: checked before the model loads."""
    given = {name: getattr(args, name) for name in _SAMPLING_FLAGS if getattr(args, name) is not None}
    model = {} if engine is None else {k: v for k, v in engine.generation.sampling.items()
                                       if k != "max_tokens"}  # capped by the context: _stream
    return SamplingParams(max_tokens=args.max_tokens, seed=args.sampling_seed,
                          **{"temperature": 0.0, **model, **given})


def _engine(args: argparse.Namespace) -> LLMEngine:
    config = engine_config_from_args(args)  # bad flags fail before torch loads (seconds)
    from inferlab.engine.llm_engine import LLMEngine

    return LLMEngine(config)


def _stream(engine: LLMEngine, prompt_ids: list[int], params: SamplingParams) -> str:
    if params.max_tokens is None:  # not asked: the model's default, within what the context leaves
        room = engine.max_model_len - len(prompt_ids)
        wanted = engine.generation.sampling.get("max_tokens", DEFAULT_MAX_TOKENS)
        params = dataclasses.replace(params, max_tokens=max(1, min(wanted, room)))
    request_id = engine.add_request(prompt_ids, params)
    text = ""
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == request_id:
                    delta = out.outputs[0].text_delta
                    text += delta
                    sys.stdout.write(delta)
                    sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C stops the reply: its KV blocks are free for the next one
        engine.abort_request(request_id)
        sys.stdout.write("\n")
        raise
    sys.stdout.write("\n")
    return text


def run_generate(args: argparse.Namespace) -> int:
    _sampling(args)  # a bad flag fails before the model loads
    if not args.prompt:
        raise InferlabError("the prompt is empty")
    _check_text(args.prompt, "the prompt")
    _check_argument_order(args.prompt, args.model)
    engine = _engine(args)
    _stream(engine, engine.tokenizer.encode(args.prompt), _sampling(args, engine))
    return 0


def _check_argument_order(prompt: str, model: str | None) -> None:
    """`generate MODEL PROMPT` (the order of `vllm serve MODEL`, of every other inferlab
    command) would say only that the prompt is no file: name the order it takes."""
    missing = model is not None and model != EMBEDDED_ALIAS and not os.path.exists(os.path.expanduser(model))
    if missing and os.path.exists(os.path.expanduser(prompt)):
        raise InferlabError(f"{model}: no such file or directory; the prompt comes first: "
                            f"inferlab generate PROMPT [MODEL]")


def run_chat(args: argparse.Namespace) -> int:
    from inferlab.models.chat_template import load_chat_template

    _sampling(args)
    _check_text(args.system or "", "--system")
    for message in args.message or ():
        _check_text(message, "--message")
    template = None if args.chat_template is None else load_chat_template(args.chat_template)
    scripted = list(args.message) if args.message else None
    if scripted is None:
        _prepare_stdin()  # a closed one is refused before the model loads
    engine = _engine(args)
    params = _sampling(args, engine)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    failed = False  # a turn was refused: the exit code says so at the end
    while (user := _next_message(scripted)) is not None:
        if scripted is None and _typed_command(user, messages):
            continue
        if scripted is None and not _valid_line(user):
            failed = True
            continue
        messages.append({"role": "user", "content": user})
        try:  # the template may refuse the turn too (roles out of order, raise_exception)
            prompt = chat_prompt_text(engine.tokenizer, messages, template=template,
                                      check_fits=engine.check_text_fits)
            reply = _stream(engine, engine.tokenizer.encode(prompt, add_special_tokens=False), params)
        except ModelLoadError:  # no chat template: every turn would fail, so the session ends
            raise
        except InferlabError as e:  # the turn is dropped; the conversation so far goes on
            print(f"error: {e}", file=sys.stderr)
            messages.pop()
            failed = True
            continue
        except KeyboardInterrupt:  # back to the prompt, as llama.cpp's and ollama's REPLs go
            if scripted is not None:  # no prompt to return to: the script stops
                raise
            # dropped, not kept cut short: the next turns would read it as the whole answer
            print("(stopped: the turn is dropped)", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
    return 2 if failed else 0


def _typed_command(line: str, messages: list[dict[str, str]]) -> bool:
    """An empty line (nothing to send) or a one-word /command, done here, as llama.cpp's and
    ollama's REPLs take them: True; a message for the model: False. /clear forgets the
    conversation but its system message; any other /word lists the commands."""
    word = line.strip()
    if word and (not word.startswith("/") or " " in word):
        return False
    if word == "/clear":
        del messages[1 if messages and messages[0]["role"] == "system" else 0:]
        print("(the conversation is cleared)", file=sys.stderr)
    elif word:
        print("commands: /clear (forget the conversation), /exit or /quit", file=sys.stderr)
    return True


def _check_text(text: str, name: str) -> None:
    """Text from the command line that is not UTF-8 (Python keeps its bytes as surrogates) is
    refused before the model loads: every turn would fail on it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InferlabError(f"{name} is not valid UTF-8 (at character {e.start})") from None


def _prepare_stdin() -> None:
    """The REPL's stdin: there (a closed one is a one-line error), read with its bytes that are
    not UTF-8 kept as surrogates (whatever the locale's strictness, a bad line is refused by
    _valid_line, not a traceback), and with line editing and history at a terminal."""
    if sys.stdin is None:
        raise InferlabError("stdin is closed: nothing to read the conversation from (use --message)")
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="surrogateescape")
    if sys.stdin.isatty():
        with contextlib.suppress(ImportError):  # input() edits lines once readline is loaded
            importlib.import_module("readline")


def _valid_line(line: str) -> bool:
    try:
        _check_text(line, "the message")
    except InferlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return False
    return True


def _next_message(scripted: list[str] | None) -> str | None:
    """The user's next message: the scripted ones in turn, else a line typed; None at the end
    (the script done, end of input, /exit or /quit)."""
    if scripted is not None:
        if not scripted:
            return None
        print(f"> {scripted[0]}")
        return scripted.pop(0)
    try:
        user = input("> ")
    except EOFError:  # Ctrl-D: the shell's prompt goes on a line of its own
        print()
        return None
    except KeyboardInterrupt:
        print()
        raise
    return None if user.strip() in ("/exit", "/quit") else user
