"""`inferlab serve [MODEL]`: the OpenAI-compatible server; defaults come from ServerSettings."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys

from inferlab.config import parse_bytes
from inferlab.engine.args import add_engine_args, engine_config_from_args
from inferlab.errors import InferlabError
from inferlab.models.embedded import EMBEDDED_ALIAS
from inferlab.server.reasoning import REASONING_PARSERS
from inferlab.server.settings import ServerSettings
from inferlab.server.tool_call_formats import AUTO_PARSERS

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ServerSettings)}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over the OpenAI API (HTTP)")
    add_engine_args(parser, serving=True)
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=_DEFAULTS["host"],
                       help="the address to listen on (default: %(default)s)")
    group.add_argument("--port", type=int, default=_DEFAULTS["port"],
                       help="0: any free port, printed (default: %(default)s)")
    group.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' (default: $INFERLAB_API_KEY)")
    group.add_argument("--served-model-name", nargs="+", default=None,
                       help="the model names clients may use, the first in /v1/models first and "
                            "in metrics (default: the model's file or folder name)")
    group.add_argument("--max-queued-requests", type=int, default=_DEFAULTS["max_queued_requests"],
                       help="sequences waiting for the engine before new requests get 503 (default: %(default)s)")
    group.add_argument("--max-request-body", default=f"{_DEFAULTS['max_request_body_bytes'] >> 20}MiB",
                       help="larger request bodies get 413, e.g. 64MiB (default: %(default)s)")
    group.add_argument("--shutdown-timeout", type=float, default=_DEFAULTS["shutdown_timeout_s"],
                       help="seconds in-flight requests get on SIGTERM before they are aborted "
                            "(default: %(default)s)")
    group.add_argument("--health-max-silence", type=float,
                       default=_DEFAULTS["health_max_silence_s"],
                       help="/health is 503 when the engine loop has been stuck this many seconds "
                            "(at least 1; default: %(default)s)")
    group.add_argument("--timeout-keep-alive", type=float,
                       default=_DEFAULTS["keep_alive_timeout_s"],
                       help="seconds an idle keep-alive connection stays open (default: %(default)s)")
    group.add_argument("--allowed-origins", action="append", default=[], type=_origins,
                       help="a browser origin allowed to call the API (CORS), e.g. "
                            "http://localhost:3000, '*' for any, or vLLM's JSON list; repeatable "
                            "(default: none)")
    group.add_argument("--chat-template", default=None,
                       help="a Jinja chat template file, or the template itself (escapes such as "
                            "\\n decoded), for chat requests instead of the model's own")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='serve tool_choice "auto" (the default with tools): the model decides '
                            "to call, and --tool-call-parser reads its calls out of the text")
    group.add_argument("--tool-call-parser", choices=sorted(AUTO_PARSERS), default=None,
                       help="how the model writes calls: hermes (<tool_call>{...}</tool_call>), "
                            "llama3_json (a reply of {\"name\": ..., \"parameters\": ...}) or "
                            "mistral ([TOOL_CALLS][{...}], or [TOOL_CALLS]name[ARGS]{...} from v11)")
    group.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                       help='with tool_choice "none", do not show the tools to the chat template')
    group.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                       help="split a reasoning model's thinking (<think>...</think>) from its "
                            "answer into reasoning (and reasoning_content): deepseek_r1 (the reply starts "
                            "thinking) or qwen3 (only a reply that opens with <think>)")
    parser.set_defaults(func=run_serve)


def _origins(value: str) -> list[str]:
    """One origin, or vLLM's form: a JSON list of them ('["http://a", "http://b"]')."""
    if not value.startswith("["):
        return [value]
    try:
        origins = json.loads(value)
    except json.JSONDecodeError:
        origins = None
    if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
        raise argparse.ArgumentTypeError(f"not an origin nor a JSON list of them: {value!r}")
    return origins


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    from inferlab.models.chat_template import load_chat_template
    from inferlab.models.model_path import model_display_name

    names = list(dict.fromkeys(args.served_model_name or [model_display_name(args.model)]))
    if args.model is None and len(names) > 1 and _looks_like_a_model(names[-1]):
        raise InferlabError(f"--served-model-name takes every name after it, {names[-1]} too: put "
                            f"the model before the flag (inferlab serve {names[-1]} "
                            f"--served-model-name ...; `embedded` names the default model)")
    return ServerSettings(
        served_model_name=names[0], served_model_aliases=tuple(names[1:]),
        host=args.host, port=args.port,
        api_key=args.api_key if args.api_key is not None else (os.environ.get("INFERLAB_API_KEY") or None),
        max_queued_requests=args.max_queued_requests,
        max_request_body_bytes=parse_bytes(args.max_request_body, "--max-request-body"),
        shutdown_timeout_s=args.shutdown_timeout, health_max_silence_s=args.health_max_silence,
        keep_alive_timeout_s=args.timeout_keep_alive,
        chat_template=None if args.chat_template is None else load_chat_template(args.chat_template),
        allowed_origins=tuple(origin for given in args.allowed_origins for origin in given),
        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        reasoning_parser=args.reasoning_parser,
    )


def _looks_like_a_model(name: str) -> bool:
    """A model folder (with config.json), a GGUF file or the embedded model's alias: what
    `serve NAME` would load."""
    from inferlab.models.gguf_reader import is_gguf_file

    path = os.path.expanduser(name)
    return (name == EMBEDDED_ALIAS or os.path.isfile(os.path.join(path, "config.json"))
            or (os.path.isfile(path) and is_gguf_file(path)))


def run_serve(args: argparse.Namespace) -> int:
    from inferlab.models.model_path import model_display_name
    from inferlab.server.listen import bind

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    bind(settings.host, settings.port).close()  # a taken port fails now, not after the model loads
    config = engine_config_from_args(args)  # bad engine flags fail before the model loads
    # only now: torch takes seconds to import, more than the checks above (15 s on a busy host)
    from inferlab.engine.async_engine import AsyncEngine
    from inferlab.server.runner import serve

    print(f"inferlab: loading {model_display_name(args.model)}...", file=sys.stderr, flush=True)
    engine = AsyncEngine.from_config(config)
    asyncio.run(serve(engine, settings))
    return 0
