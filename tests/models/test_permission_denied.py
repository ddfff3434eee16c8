"""A model file or folder we may not read says "Permission denied", as config.json and
tokenizer.json did: a chmod 000 model.safetensors was "No such file or directory" (safetensors'
words), a chmod 000 folder "config.json: missing", and `plan` on it, or on a chmod 000 GGUF
file, a PermissionError traceback.
Run without the permission bypass: as root, under capsh with cap_dac_override dropped."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from .tiny_gguf import write_tiny_gguf

DENIED = "Permission denied"


def _unprivileged(argv: list[str]) -> subprocess.CompletedProcess:
    """`inferlab ARGV` where file permissions hold: root's bypass dropped with capsh."""
    command = [sys.executable, "-m", "inferlab.cli", *argv]
    if os.geteuid() == 0:
        if shutil.which("capsh") is None:
            pytest.skip("root without capsh: file permissions cannot be made to hold")
        command = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--",
                   "-c", shlex.join(command)]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def locked():
    """Whatever the test chmods 000 is given back its modes, so that pytest can remove it."""
    paths = []
    yield paths.append
    for path in paths:
        os.chmod(path, 0o755)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _assert_denied(done: subprocess.CompletedProcess, path) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: {path}: cannot be read ({DENIED})\n"


def test_an_unreadable_weights_file(tiny_dir, tmp_path, locked) -> None:
    model = _copy(tiny_dir, tmp_path / "m")
    os.chmod(model / "model.safetensors", 0)
    locked(model / "model.safetensors")
    done = _unprivileged(["generate", "hi", str(model), "--max-tokens", "1"])
    _assert_denied(done, model / "model.safetensors")


@pytest.mark.parametrize("command", [["info"], ["generate", "hi"], ["plan", "--hardware", "H100-SXM"]])
def test_a_folder_we_may_not_search(tiny_dir, tmp_path, locked, command) -> None:
    model = _copy(tiny_dir, tmp_path / "m")
    os.chmod(model, 0)
    locked(model)
    _assert_denied(_unprivileged([*command, str(model)]), model / "config.json")


@pytest.mark.parametrize("command", [["info"], ["plan", "--hardware", "H100-SXM"]])
def test_a_path_inside_a_folder_we_may_not_search(tiny_dir, tmp_path, locked, command) -> None:
    model = _copy(tiny_dir, tmp_path / "m")
    os.chmod(model, 0)
    locked(model)
    _assert_denied(_unprivileged([*command, str(model / "config.json")]), model / "config.json")


@pytest.mark.parametrize("command", [["info"], ["generate", "hi"], ["plan", "--hardware", "H100-SXM"]])
def test_an_unreadable_gguf_file(tmp_path, locked, command) -> None:
    model = write_tiny_gguf(tmp_path / "tiny.gguf")
    os.chmod(model, 0)
    locked(model)
    _assert_denied(_unprivileged([*command, str(model)]), model)
