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
from inferlab.engine.context_room import output_room, over_context
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import ContextLengthError, InferlabError, ModelLoadError
from inferlab.models.embedded import EMBEDDED_ALIAS

if TYPE_CHECKING:  # the engine (and torch) load only once the flags are checked
    from inferlab.engine.llm_engine import LLMEngine
    from inferlab.engine.outputs import RequestOutput, TokenLogprobs


def register(subparsers: argparse._SubParsersAction) -> None:
    gen = subparsers.add_parser("generate", help="complete one prompt and print the text")
    gen.add_argument("prompt")
    _add_sampling_args(gen)
    _add_completion_args(gen)
    add_engine_args(gen)
    gen.set_defaults(func=run_generate)
    chat = subparsers.add_parser(
        "chat", help="chat with the model in the terminal (streaming)",
        description="Chat with the model in the terminal, its replies streamed. At the > prompt: "
                    "/clear forgets the conversation (the system message stays), /exit or /quit "
                    "or Ctrl-D ends the session; Ctrl-C stops a reply and drops the turn, and at "
                    "the prompt ends the session. A turn the model cannot take (too long for the "
                    "context, refused by the template) is dropped and the session goes on; the "
                    "exit status is then 2 at the end, else 0.")
    chat.add_argument("--system", "--system-prompt", dest="system", default=None,
                      help="system message (--system-prompt as vllm chat names it)")
    chat.add_argument("--chat-template", default=None,
                      help="a Jinja chat template file, or the template itself, instead of the "
                           "model's own (as serve's --chat-template)")
    chat.add_argument("--message", "-q", "--quick", dest="message", action="append", default=None,
                      help="send this user message, print the reply, and exit (repeatable: "
                           "one turn each; -q/--quick as vllm chat names it); without it, a REPL")
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
    parser.add_argument("--min-tokens", type=int, default=None,
                        help="tokens before EOS, stop token ids or --stop may end the reply "
                             "(default: 0)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="go on past EOS (and the model's eos_token_id list) up to --max-tokens")


def _add_completion_args(parser: argparse.ArgumentParser) -> None:
    """generate's alone: a chat's next turn takes one reply, and its replies stream as text."""
    parser.add_argument("-n", "--n", type=int, default=None,
                        help="completions of the prompt, each printed after a --- line once all "
                             "are done (default: 1, streamed)")
    parser.add_argument("--logprobs", type=int, default=None, metavar="K",
                        help="after the text, each token's logprob and rank, and the K most "
                             "likely tokens' (0 to 20; 0: the chosen token's alone)")


# the flags of SamplingParams' fields, by their names; generate's alone are absent from chat's args
_SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "stop", "min_tokens", "ignore_eos",
                   "n", "logprobs")


def _sampling(args: argparse.Namespace, engine: LLMEngine | None = None) -> SamplingParams:
    """The flags given, over the engine's model's generation_config.json sampling fields (what
    --generation-config auto makes the defaults, as the server and LLM take them), over greedy.
    Without an engine, the flags alone: checked before the model loads."""
    given = {name: getattr(args, name, None) for name in _SAMPLING_FLAGS
             if getattr(args, name, None) is not None}
    model = {} if engine is None else {k: v for k, v in engine.generation.sampling.items()
                                       if k != "max_tokens"}  # capped by the context: _stream
    return SamplingParams(max_tokens=args.max_tokens, seed=args.sampling_seed,
                          **{"temperature": 0.0, **model, **given})


def _engine(args: argparse.Namespace) -> LLMEngine:
    config = engine_config_from_args(args)  # bad flags fail before torch loads (seconds)
    from inferlab.engine.llm_engine import LLMEngine

    return LLMEngine(config)


def _stream(engine: LLMEngine, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
    """Run one request to its end, its text written as it comes where it has one completion;
    its last output, every completion whole."""
    if params.max_tokens is None:  # not asked: the model's default, within what the context leaves
        room = output_room(len(prompt_ids), engine.max_model_len)
        if params.min_tokens > room:  # once "min_tokens must not exceed max_tokens", one not given
            raise over_context(len(prompt_ids), params.min_tokens, engine.max_model_len, "min_tokens")
        wanted = max(engine.generation.sampling.get("max_tokens", DEFAULT_MAX_TOKENS), params.min_tokens)
        params = dataclasses.replace(params, max_tokens=min(wanted, room))
    request_id = engine.add_request(prompt_ids, params)
    streamed = params.n == 1  # n replies side by side would interleave: they print at the end
    last = None
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id == request_id:
                    last = out
                    if streamed:
                        sys.stdout.write(out.outputs[0].text_delta)
                        sys.stdout.flush()
    except KeyboardInterrupt:  # Ctrl-C stops the reply: its KV blocks are free for the next one
        engine.abort_request(request_id)
        sys.stdout.write("\n")
        raise
    if streamed:
        sys.stdout.write("\n")
    assert last is not None and last.finished  # the engine ran until the request finished
    return last


def _print_completions(output: RequestOutput) -> None:
    """What _stream did not write: each of several completions after its --- line, and where
    logprobs were asked for, each completion's table after its text."""
    for completion in output.outputs:
        if len(output.outputs) > 1:
            print(f"--- completion {completion.index + 1} of {len(output.outputs)}")
            print(completion.text)
        if completion.logprobs is not None:
            _print_logprobs(completion.logprobs)


def _print_logprobs(entries: list[TokenLogprobs]) -> None:
    """One line a token: its text (quoted: spaces and newlines show), logprob and rank, then
    the most likely tokens'."""
    for entry in entries:
        chosen = entry[entry.token_id]
        line = f"{chosen.decoded_token!r} {chosen.logprob:.4f} (rank {chosen.rank})"
        if entry.top:
            line += "  top: " + ", ".join(f"{entry[t].decoded_token!r} {logprob:.4f}"
                                          for t, logprob in entry.top)
        print(line)


def run_generate(args: argparse.Namespace) -> int:
    _sampling(args)  # a bad flag fails before the model loads
    if not args.prompt:
        raise InferlabError("the prompt is empty")
    _check_text(args.prompt, "the prompt")
    _check_argument_order(args.prompt, args.model)
    engine = _engine(args)
    _print_completions(_stream(engine, engine.tokenizer.encode(args.prompt), _sampling(args, engine)))
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
            reply = _stream(engine, _prompt_ids(engine, messages, template), params).outputs[0].text
        except ModelLoadError:  # no chat template: every turn would fail, so the session ends
            raise
        except InferlabError as e:  # the turn is dropped; the conversation so far goes on
            hint = scripted is None and isinstance(e, ContextLengthError) and \
                _fits_after_clear(engine, messages, template, params)
            print(f"error: {e}{' (/clear starts over)' if hint else ''}", file=sys.stderr)
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


def _prompt_ids(engine: LLMEngine, messages: list[dict[str, str]], template: str | None) -> list[int]:
    prompt = chat_prompt_text(engine.tokenizer, messages, template=template,
                              check_fits=engine.check_text_fits)
    return engine.tokenizer.encode(prompt, add_special_tokens=False)


def _fits_after_clear(engine: LLMEngine, messages: list[dict[str, str]], template: str | None,
                      params: SamplingParams) -> bool:
    """Whether the last message, refused for the context, would be taken after /clear: the
    conversation, not the message, outgrew the context, and every later turn fails the same way
    until it is cleared. Checked as the engine checks a request it is given."""
    alone = [*messages[:_kept_by_clear(messages)], messages[-1]]
    if len(alone) == len(messages):  # nothing earlier to forget
        return False
    try:
        engine.requests.build("probe", _prompt_ids(engine, alone, template), None, params,
                              arrival=0.0, priority=0, cap_max_tokens=False)
    except InferlabError:
        return False
    return True


def _kept_by_clear(messages: list[dict[str, str]]) -> int:
    """How many of the first messages /clear keeps: the system message."""
    return 1 if messages and messages[0]["role"] == "system" else 0


def _typed_command(line: str, messages: list[dict[str, str]]) -> bool:
    """An empty line (nothing to send) or a one-word /command, done here, as llama.cpp's and
    ollama's REPLs take them: True; a message for the model: False. /clear forgets the
    conversation but its system message; any other /word lists the commands."""
    word = line.strip()
    if word and (not word.startswith("/") or " " in word):
        return False
    if word == "/clear":
        del messages[_kept_by_clear(messages):]
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
