"""A report that cannot be written in full (a full disk) is a one-line error and leaves no file
behind: `plan --html` and `eval --output` once left a 0-byte file that passed for a result."""

from __future__ import annotations

import builtins
import errno
import os
import stat
import subprocess

import pytest

from inferlab import user_files
from inferlab.cli import main
from inferlab.errors import InferlabError
from inferlab.user_files import write_user_text


def _result():
    from inferlab.eval.result import EvalResult

    return EvalResult(model="m", dataset="d", seq_len=8, dtype="float32", via_engine=False,
                      windows=1, tokens=7, nll=2.0, ppl=7.39, elapsed_s=1.0)


def _enospc(*_args) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def full_disk(monkeypatch):
    """Files open as usual, then every write fails as on a full disk (after the file exists)."""
    def open_on_full_disk(path, *args, **kwargs):
        f = builtins.open(path, *args, **kwargs)  # noqa: SIM115 -- the caller closes it
        f.write = _enospc
        return f

    monkeypatch.setattr(user_files, "open", open_on_full_disk, raising=False)


def test_a_failed_write_removes_the_partial_file(tmp_path, full_disk) -> None:
    report = tmp_path / "r.json"
    with pytest.raises(OSError) as failed:
        write_user_text(report, "{}\n")
    assert failed.value.errno == errno.ENOSPC
    assert not report.exists()


@pytest.mark.skipif(not os.path.exists("/dev/full") or not stat.S_ISCHR(os.stat("/dev/full").st_mode),
                    reason="no /dev/full device (writing would make it a plain file)")
def test_a_device_is_never_removed() -> None:
    """/dev/full takes the open and refuses the bytes: the error stands, the device stays."""
    with pytest.raises(OSError) as failed:
        write_user_text("/dev/full", "x" * 100_000)
    assert failed.value.errno == errno.ENOSPC
    assert os.path.exists("/dev/full")


def test_plan_html_on_a_full_disk(tmp_path, full_disk, capsys) -> None:
    html = tmp_path / "plan.html"
    assert main(["plan", "Llama-3.1-8B", "--hardware", "h100-sxm", "--html", str(html)]) == 2
    assert capsys.readouterr().err == f"error: --html: cannot write {html}: No space left on device\n"
    assert os.listdir(tmp_path) == []


def test_eval_output_on_a_full_disk(tmp_path, full_disk) -> None:
    from inferlab.eval.result import write_json

    out = tmp_path / "r.json"
    with pytest.raises(InferlabError, match=r"r\.json: cannot write the result \(No space left on device\)$"):
        write_json(_result(), str(out))
    assert os.listdir(tmp_path) == []


@pytest.fixture
def full_tmpfs(tmp_path):
    """A real tmpfs with no room left (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with open(disk / "fill", "wb") as f, pytest.raises(OSError):  # no room left after it
            f.write(b"\0" * 65536)
            f.flush()
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_plan_html_on_a_real_full_tmpfs(full_tmpfs, capsys) -> None:
    html = full_tmpfs / "plan.html"
    assert main(["plan", "Llama-3.1-8B", "--hardware", "h100-sxm", "--html", str(html)]) == 2
    assert capsys.readouterr().err == f"error: --html: cannot write {html}: No space left on device\n"
    assert os.listdir(full_tmpfs) == ["fill"]


def test_eval_output_on_a_real_full_tmpfs(full_tmpfs) -> None:
    from inferlab.eval.result import write_json

    with pytest.raises(InferlabError, match=r"cannot write the result \(No space left on device\)$"):
        write_json(_result(), str(full_tmpfs / "r.json"))
    assert os.listdir(full_tmpfs) == ["fill"]
