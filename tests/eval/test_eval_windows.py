"""Reading the text and cutting it into windows, checked by hand."""

from __future__ import annotations

import pytest

from inferlab.errors import InferlabError
from inferlab.eval.dataset import cut_windows, read_text
from inferlab.eval.result import EvalResult, render


def test_windows_are_consecutive_and_the_partial_tail_is_dropped():
    assert cut_windows(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cut_windows(list(range(12)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert cut_windows(list(range(10)), 4, limit=1) == [[0, 1, 2, 3]]
    assert cut_windows(list(range(10)), 4, limit=5) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_text_shorter_than_one_window_is_an_error():
    with pytest.raises(InferlabError, match="3 tokens, fewer than one window of --seq-len 4"):
        cut_windows([1, 2, 3], 4)
    with pytest.raises(InferlabError, match="has 1 token, fewer"):  # once "1 tokens"
        cut_windows([1], 4)


def test_crlf_becomes_lf_and_nothing_else_changes(tmp_path):
    path = tmp_path / "t.raw"
    path.write_bytes(b" = Title = \r\n\r\n caf\xc3\xa9 \r x\n")
    assert read_text(str(path)) == " = Title = \n\n café \r x\n"


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such dataset file"),
    (b"\xff\xfe\x00bad", "not UTF-8 text"),
    (b"  \r\n\n", "the dataset is empty"),
])
def test_unreadable_datasets_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "t.raw"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InferlabError, match=message) as info:
        read_text(str(path))
    assert "\n" not in str(info.value)


def test_the_real_wikitext_test_split_reads_as_lf_text(shared_file):
    text = read_text(str(shared_file("wikitext-2-raw/wiki.test.raw")))
    assert "\r" not in text
    # the README's 1,290,547 bytes and 2,891 CRLF line ends, each one byte shorter now
    assert len(text.encode("utf-8")) == 1_290_547 - 2_891
    assert text.count("\n") == 2_891


def test_the_summary_line_counts_one_window_in_the_singular():
    """Once "1 windows of 67 tokens"."""
    one = EvalResult(model="m", dataset="d", seq_len=67, dtype="float32", via_engine=False,
                     windows=1, tokens=66, nll=2.0, ppl=7.389, elapsed_s=1.0)
    assert "m on d: 1 window of 67 tokens, 66 predicted tokens" in render(one)
    two = EvalResult(model="m", dataset="d", seq_len=67, dtype="float32", via_engine=False,
                     windows=2, tokens=132, nll=2.0, ppl=7.389, elapsed_s=1.0)
    assert "m on d: 2 windows of 67 tokens" in render(two)
