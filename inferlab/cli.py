"""`inferlab <command>`: each command lives in its own package's cli.py and registers itself."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from inferlab.errors import InferlabError

# command modules, imported lazily so `inferlab bench` never imports torch
COMMAND_MODULES = (
    "inferlab.models.cli",  # info
    "inferlab.engine.cli",  # generate, chat
    "inferlab.server.cli",  # serve
    "inferlab.bench.cli",  # bench
    "inferlab.planner.cli",  # plan
    "inferlab.quant.cli",  # quantize
    "inferlab.eval.cli",  # eval
)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferlab", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = argv[0] if argv and not argv[0].startswith("-") else None
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that command is not built yet
                continue
            raise
        module.register(subparsers)
        if wanted is not None and wanted in subparsers.choices:
            break
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InferlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `inferlab info | head`: the reader left, which is no error of ours
        silence_stdout()
        return 0


def silence_stdout() -> None:
    """After a broken pipe: stdout goes nowhere, so that its flush at exit fails no second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
