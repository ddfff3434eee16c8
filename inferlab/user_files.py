"""Reading the user's text files (datasets, calibration text, prompt data, reports): a bad one
is a one-line error that names the file, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferlab.errors import InferlabError


def read_user_text(path: str | Path, kind: str = "file") -> str:
    """The whole file as UTF-8 text, line ends as they are (callers that want LF normalize);
    `kind` names the file in the errors ("no such dataset file")."""
    if not str(path):
        raise InferlabError(f"the {kind} path is empty")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise InferlabError(f"{path}: no such {kind}") from None
    except IsADirectoryError:
        raise InferlabError(f"{path}: is a directory, not a {kind}") from None
    except UnicodeDecodeError as e:
        raise InferlabError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:  # no permission, a device...
        raise InferlabError(f"{path}: cannot be read ({e.strerror})") from None


def read_user_json(path: str | Path, kind: str = "file") -> Any:
    """The file's JSON value; a file that cannot be read or is not JSON is a one-line error."""
    try:
        return json.loads(read_user_text(path, kind))
    except json.JSONDecodeError as e:
        raise InferlabError(f"{path}: not valid JSON ({e})") from None
