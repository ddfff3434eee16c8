"""Runs benchmark scripts in this one process, each with its own argv, and prints a JSON list of
what each did: exit code, stdout, stderr. Used by test_benchmark_args.py, so that its refusals
pay Python's and torch's start once instead of once each.

usage: python benchmark_args_driver.py SCRIPTS_DIR TIMEOUT_S < cases.json  ([[script, [args]], ...])
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import signal
import sys
import traceback
from pathlib import Path


class StillRunning(Exception):
    """The case outlived its alarm: the script went on to run instead of refusing."""


def _on_alarm(signum, frame):
    raise StillRunning


def run_case(scripts: Path, script: str, args: list[str], timeout_s: int) -> dict:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [str(scripts / script), *args]
    code: object = 0
    signal.alarm(timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(scripts / script), run_name="__main__")
    except SystemExit as e:
        code = e.code
    except StillRunning:
        code = "still running"
    except Exception:  # a crash fails this case (its traceback in stderr), not the others
        traceback.print_exc(file=err)
        code = 1
    finally:
        signal.alarm(0)
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    scripts, timeout_s = Path(sys.argv[1]), int(sys.argv[2])
    sys.path.insert(0, str(scripts))  # the scripts import workloads.py from beside them
    signal.signal(signal.SIGALRM, _on_alarm)
    cases = json.load(sys.stdin)
    print(json.dumps([run_case(scripts, script, args, timeout_s) for script, args in cases]))


if __name__ == "__main__":
    main()
