"""`inferlab quantize` onto a disk that fills up: a one-line error and exit code 2 (once a
SafetensorError traceback), with nothing left behind where --out was to be made."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from inferlab.cli import main
from inferlab.quant import export

from .tiny import tiny_model_dir

pytest.importorskip("transformers")
from safetensors import SafetensorError  # noqa: E402

# safetensors' own words for a full disk (seen from save_file on a full tmpfs)
ENOSPC_SAFETENSORS = "Error while serializing: I/O error: No space left on device (os error 28)"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("src"))


def _quantize(source, out) -> int:
    return main(["quantize", str(source), "--scheme", "W8A16", "--out", str(out), "--quiet"])


def _assert_one_line_full_disk(code: int, out, capsys) -> None:
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"error: {out}: cannot write the checkpoint (No space left on device)\n"


def test_safetensors_full_disk_is_one_line(source, tmp_path, monkeypatch, capsys) -> None:
    def full(*_args, **_kwargs):
        raise SafetensorError(ENOSPC_SAFETENSORS)

    monkeypatch.setattr(export, "save_file", full)
    out = tmp_path / "a" / "b" / "out"
    _assert_one_line_full_disk(_quantize(source, out), out, capsys)
    assert os.listdir(tmp_path) == []  # no staging folder, no parents made for it


def test_a_full_disk_while_copying_the_tokenizer_is_one_line(source, tmp_path, monkeypatch,
                                                             capsys) -> None:
    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export, "write_tokenizer", full)
    out = tmp_path / "out"
    _assert_one_line_full_disk(_quantize(source, out), out, capsys)
    assert os.listdir(tmp_path) == []


def test_other_failures_still_raise(source, tmp_path, monkeypatch) -> None:
    """A bug is no user error: it keeps its traceback (and the staging folder still goes)."""
    def broken(*_args, **_kwargs):
        raise SafetensorError("Error while serializing: tensor is not contiguous")

    monkeypatch.setattr(export, "save_file", broken)
    with pytest.raises(SafetensorError):
        _quantize(source, tmp_path / "out")
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_real_full_tmpfs(source, tmp_path, capsys) -> None:
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = disk / "a" / "b" / "out"
        _assert_one_line_full_disk(_quantize(source, out), out, capsys)
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)
