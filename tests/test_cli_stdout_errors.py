"""Every failure of stdout (`> /dev/full`, `>&-`) is one line of error and exit code 2, whatever
the output's size and buffering: past the buffer's size (/dev/full's is 4 KiB) a failed flush
drops its bytes, and the check for stdout's failure, a second flush, once found nothing left to
fail on: a traceback. With PYTHONUNBUFFERED=1 the print itself failed: a traceback too."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys

import pytest

from inferlab import cli

FULL = "error: stdout: cannot write the output (No space left on device)\n"
OUTPUTS = {
    "long": ["plan", "Llama-3.1-8B", "--hardware", "H100-SXM", "--json"],  # about 6 KB
    "short": ["plan", "--list"],  # under 4 KiB
    "help": ["--help"],  # argparse swallows its write error and exits 0
}


def _has_dev_full() -> bool:
    return os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)


def _run(argv: list[str], unbuffered: bool, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1" if unbuffered else ""}
    return subprocess.run([sys.executable, "-m", "inferlab.cli", *argv], stderr=subprocess.PIPE,
                          text=True, env=env, timeout=120, **kwargs)


@pytest.mark.skipif(not _has_dev_full(), reason="no /dev/full device here")
@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("output", list(OUTPUTS))
def test_a_full_stdout_is_one_line_and_exit_2(output: str, unbuffered: bool) -> None:
    with open("/dev/full", "w") as full:
        done = _run(OUTPUTS[output], unbuffered, stdout=full)
    assert (done.returncode, done.stderr) == (2, FULL)


def test_a_closed_stdout_is_one_line_and_exit_2() -> None:
    """`inferlab plan --list >&-`: Python's sys.stdout is None; print once did nothing and the
    final flush raised AttributeError."""
    done = _run(OUTPUTS["short"], False, stdout=None, pass_fds=(), preexec_fn=lambda: os.close(1))
    assert (done.returncode, done.stderr) == (2, "error: stdout: cannot write the output "
                                                 "(stdout is closed)\n")


def test_a_reader_that_left_is_no_error() -> None:
    """`inferlab plan ... | head -c 0`: exit 0 and nothing on stderr, as before."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        done = _run(OUTPUTS["long"], False, stdout=write_end)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


def test_an_oserror_that_is_not_stdouts_keeps_its_traceback(monkeypatch, capsys) -> None:
    """A command's own OSError (a bug) is not blamed on stdout."""
    def failing(_args) -> int:
        print("some output")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    parsed = cli.parse_command_line(["plan", "--list"])
    parsed.func = failing
    monkeypatch.setattr(cli, "parse_command_line", lambda _argv: parsed)
    with pytest.raises(OSError):
        cli.main(["plan", "--list"])
    assert capsys.readouterr().out == "some output\n"


def test_silencing_stdout_leaves_no_descriptor_open() -> None:
    # what /proc/self/fd holds after two calls, against before: the devnull descriptor is closed
    script = ("import os, sys; from inferlab.cli import silence_stdout; "
              "before = set(os.listdir('/proc/self/fd')); silence_stdout(); silence_stdout(); "
              "print(sorted(set(os.listdir('/proc/self/fd')) - before), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr.strip()) == (0, "[]")
