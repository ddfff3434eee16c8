"""`inferlab <command>`: each command lives in its own package's cli.py and registers itself."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from typing import TextIO

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
    parser = argparse.ArgumentParser(
        prog="inferlab", description="An LLM inference stack: generate and chat, an OpenAI-compatible "
        "server, quantization, evaluation, a load tester and a capacity planner. "
        "`inferlab COMMAND --help` says more of each.")
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
    stdout = _WatchedStdout(sys.stdout)
    sys.stdout = stdout
    try:
        return _run(argv, stdout)
    finally:
        sys.stdout = stdout.stream


def _run(argv: list[str], stdout: _WatchedStdout) -> int:
    try:
        args = parse_command_line(argv)  # --help prints here
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
    except OSError:
        if stdout.error is None:  # not stdout's: a bug, with its traceback
            raise
        return _stdout_failed(stdout)
    except SystemExit as e:  # --help, whose write error argparse swallows before exiting 0
        if e.code in (0, None):
            with contextlib.suppress(OSError):
                sys.stdout.flush()  # now: at exit a failure is two lines and exit code 120
        if stdout.error is None or e.code not in (0, None):
            raise
        return _stdout_failed(stdout)


class _WatchedStdout:
    """sys.stdout, keeping the error of a write to it that failed, so that an OSError is known
    for stdout's whatever the output's size: past the buffer's size a failed flush drops the
    bytes, so that asking stdout again (a second flush) finds nothing left to fail on; with
    PYTHONUNBUFFERED=1 the print itself fails. A closed stdout (`>&-`, None) fails each write."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        return self._watched("write", text)

    def flush(self) -> None:
        self._watched("flush")

    def _watched(self, method: str, *args: str) -> int | None:
        try:
            if self.stream is None:
                raise OSError(errno.EBADF, "stdout is closed")
            return getattr(self.stream, method)(*args)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding...: the stream's own
        return getattr(self.stream, name)


def _stdout_failed(stdout: _WatchedStdout) -> int:
    """The exit once stdout refused the output: a reader that left is no error (exit 0)."""
    if stdout.stream is not None:
        silence_stdout()  # the leftover bytes must not fail once more at exit
    if isinstance(stdout.error, BrokenPipeError):
        return 0
    print(f"error: stdout: cannot write the output ({stdout.error.strerror})", file=sys.stderr)
    return 2


def silence_stdout() -> None:
    """After a broken pipe: stdout goes nowhere, so that its flush at exit fails no second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
