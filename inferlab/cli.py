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


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """`inferlab COMMAND ...` with the command's options and positionals in any order, as
    parse_intermixed_args reads them (`generate hi --max-tokens 3 MODEL`: parse_args would take
    MODEL for an unknown argument, the optional positional being passed over by then); a command
    with subcommands of its own (bench), or a `--` (`generate -- -hello`: intermixed parsing
    drops it and reads what follows as options again), as parse_args reads it."""
    parser = build_parser(argv)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = commands.choices.get(argv[0]) if argv else None
    if (command is None or "--" in argv
            or any(isinstance(a, argparse._SubParsersAction) for a in command._actions)):
        return parser.parse_args(argv)
    args = command.parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_command_line(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a stdout that cannot take it is one line below
        return status
    except InferlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `inferlab info | head`: the reader left, which is no error of ours
        silence_stdout()
        return 0
    except OSError as e:
        if not _stdout_refuses():
            raise
        silence_stdout()
        print(f"error: stdout: cannot write the output ({e.strerror})", file=sys.stderr)
        return 2


def _stdout_refuses() -> bool:
    """Whether stdout is what failed (`inferlab info > /dev/full`): a failed write leaves its
    bytes buffered, so a second flush fails too; an OSError from elsewhere finds it flushable."""
    try:
        sys.stdout.flush()
    except OSError:
        return True
    return False


def silence_stdout() -> None:
    """After a broken pipe: stdout goes nowhere, so that its flush at exit fails no second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
