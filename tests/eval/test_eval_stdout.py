"""A stdout that cannot take a command's output (`> /dev/full`, a full disk) is one line of
error and exit 2 (inferlab.cli.main), with `eval --output`'s JSON written first; it was a
traceback. Real processes with a redirected (block-buffered) stdout, so that the exit's own flush
of stdout is part of what is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")


def _run_into_full_stdout(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": ""}
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "inferlab.cli", *argv], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=300)


def _assert_one_line_exit_2(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr == "error: stdout: cannot write the output (No space left on device)\n", done.stderr


def test_eval_into_a_full_stdout_keeps_its_json(char_models, char_text_file, tmp_path):
    (base_dir, _), _ = char_models
    out = tmp_path / "result.json"
    _assert_one_line_exit_2(_run_into_full_stdout(
        ["eval", str(base_dir), "--dataset", str(char_text_file), "--seq-len", "16", "--limit", "2",
         "--dtype", "float32", "--output", str(out)]))
    assert json.loads(out.read_text())["windows"] == 2


def test_info_into_a_full_stdout(char_models):
    (base_dir, _), _ = char_models
    _assert_one_line_exit_2(_run_into_full_stdout(["info", str(base_dir)]))


def test_eval_whose_output_file_cannot_be_written_still_prints_its_figures(char_models,
                                                                          char_text_file):
    """`--output` on a full disk once ended the run with the write's error alone: the figures of
    a run that may have taken hours were lost."""
    (base_dir, _), _ = char_models
    done = subprocess.run([sys.executable, "-m", "inferlab.cli", "eval", str(base_dir), "--dataset",
                           str(char_text_file), "--seq-len", "16", "--limit", "2", "--dtype",
                           "float32", "--output", "/dev/full"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: /dev/full: cannot write the result (No space left on device)")
    assert "perplexity " in done.stdout and "2 windows of 16 tokens" in done.stdout
