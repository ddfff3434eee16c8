"""A report that cannot be written once the run is over (a full disk: /dev/full takes the open
and refuses the bytes) is a one-line error; the other reports are written and the summary
printed all the same, so a long run is not lost for one file."""

from __future__ import annotations

import json
import os
import stat

import pytest

from inferlab.cli import main

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/full") or not stat.S_ISCHR(os.stat("/dev/full").st_mode),
    reason="no /dev/full device")


def test_a_report_on_a_full_disk_loses_no_other(mock_server, corpus, tmp_path, capsys):
    full, good = tmp_path / "full.json", tmp_path / "good.csv"
    full.symlink_to("/dev/full")
    argv = ["bench", "--target", mock_server(), "--profile", "synchronous", "--max-requests", "3",
            "--data", "prompt_tokens=8,output_tokens=4", "--data-file", str(corpus),
            "--calibration-seconds", "0", "--quiet", "--output", str(full), "--output", str(good)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err == (f"error: --output {full}: cannot write (No space left on device)\n"
                   f"wrote {good}\n")
    assert "synchronous" in out and "ttft_ms" in out  # the summary
    assert good.read_text().count("\n") == 2  # the header and the stage
    assert full.is_symlink() and os.path.exists("/dev/full")  # the device stays


def test_compare_page_on_a_full_disk(mock_server, corpus, tmp_path, capsys):
    report, page = tmp_path / "r.json", tmp_path / "c.html"
    assert main(["bench", "--target", mock_server(), "--profile", "synchronous",
                 "--max-requests", "3", "--data", "prompt_tokens=8,output_tokens=4",
                 "--data-file", str(corpus), "--calibration-seconds", "0", "--quiet",
                 "--output", str(report)]) == 0
    assert len(json.loads(report.read_text())["stages"][0]["requests"]) == 3
    page.symlink_to("/dev/full")
    capsys.readouterr()
    assert main(["bench", "compare", str(report), str(report), "--output", str(page)]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: compare --output {page}: cannot write (No space left on device)\n"
    assert "ttft_ms" in out  # the comparison is shown
