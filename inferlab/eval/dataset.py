"""The evaluation text and its cut into non-overlapping windows of tokens."""

from __future__ import annotations

from collections.abc import Sequence

from inferlab.errors import InferlabError
from inferlab.user_files import read_user_text


def read_text(path: str) -> str:
    """The whole file as text, CRLF line ends turned into LF (WikiText ships with CRLF)."""
    text = read_user_text(path, "dataset file (--dataset)", as_lf=("\r\n",))
    if not text.strip():
        raise InferlabError(f"{path}: the dataset is empty")
    return text


def cut_windows(ids: Sequence[int], seq_len: int, limit: int | None = None) -> list[list[int]]:
    """Consecutive windows of exactly seq_len tokens; a last partial window is dropped.

    As in the GPTQ/AWQ evaluations: window w is ids[w*seq_len:(w+1)*seq_len], scored on its own
    (no context carried over), so each window predicts seq_len - 1 tokens.
    """
    count = len(ids) // seq_len
    if count == 0:
        raise InferlabError(f"the dataset has {len(ids)} token{'s' if len(ids) != 1 else ''}, "
                            f"fewer than one window of --seq-len {seq_len}")
    if limit is not None:
        count = min(count, limit)
    return [list(ids[w * seq_len:(w + 1) * seq_len]) for w in range(count)]
