"""Reading the user's files (reports, prompt data): a bad one is a one-line error."""

from __future__ import annotations

from pathlib import Path

from inferlab.errors import InferlabError


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InferlabError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:  # a folder of that name, no permission...
        raise InferlabError(f"{path}: cannot read ({e.strerror})") from None
