"""The evaluation text and its cut into non-overlapping windows of tokens."""

from __future__ import annotations

from collections.abc import Sequence

from inferlab.errors import InferlabError


def read_text(path: str) -> str:
    """The whole file as text, CRLF line ends turned into LF (WikiText ships with CRLF)."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise InferlabError(f"{path}: no such dataset file") from None
    except IsADirectoryError:
        raise InferlabError(f"{path}: is a directory, expected a text file") from None
    except UnicodeDecodeError as e:
        raise InferlabError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InferlabError(f"{path}: cannot be read ({e.strerror})") from None
    if not text.strip():
        raise InferlabError(f"{path}: the dataset is empty")
    return text.replace("\r\n", "\n")


def cut_windows(ids: Sequence[int], seq_len: int, limit: int | None = None) -> list[list[int]]:
    """Consecutive windows of exactly seq_len tokens; a last partial window is dropped.

    As in the GPTQ/AWQ evaluations: window w is ids[w*seq_len:(w+1)*seq_len], scored on its own
    (no context carried over), so each window predicts seq_len - 1 tokens.
    """
    count = len(ids) // seq_len
    if count == 0:
        raise InferlabError(f"the dataset has {len(ids)} tokens, fewer than one window of "
                            f"--seq-len {seq_len}")
    if limit is not None:
        count = min(count, limit)
    return [list(ids[w * seq_len:(w + 1) * seq_len]) for w in range(count)]
