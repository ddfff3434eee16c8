"""Reading the user's text files (datasets, calibration text, prompt data, reports): a bad one
is a one-line error that names the file, never a traceback; writing reports leaves no partial
file behind."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferlab.errors import InferlabError


def read_user_text(path: str | Path, kind: str = "file", as_lf: tuple[str, ...] = ()) -> str:
    """The whole file as UTF-8 text, line ends as they are except those in `as_lf`, read as LF
    in that order (CRLF alone, or CRLF then a lone CR, as open() reads them); `kind` names the
    file in the errors ("no such dataset file")."""
    if not str(path):
        raise InferlabError(f"the {kind} path is empty")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except FileNotFoundError:
        raise InferlabError(f"{path}: no such {kind}") from None
    except IsADirectoryError:
        raise InferlabError(f"{path}: is a directory, not a {kind}") from None
    except UnicodeDecodeError as e:
        raise InferlabError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:  # no permission, a device...
        raise InferlabError(f"{path}: cannot be read ({e.strerror})") from None
    for line_end in as_lf:
        text = text.replace(line_end, "\n")
    return text


def stat_user_path(path: str | Path) -> os.stat_result | None:
    """os.stat of the user's `path`, None where nothing is there (nor can be: a name too long
    for a file's, such as a JSON argument). One that cannot be looked at (a folder on the way
    we may not search) is a one-line error saying why, not "missing": os.path.exists and
    isfile say False for both, Path.is_dir raises PermissionError."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return None
        raise InferlabError(f"{path}: cannot be read ({e.strerror})") from None


def is_user_file(path: str | Path) -> bool:
    """Whether `path` is a regular file (stat_user_path's errors for one we may not look at)."""
    found = stat_user_path(path)
    return found is not None and stat.S_ISREG(found.st_mode)


def check_readable(path: str | Path) -> None:
    """Open `path` for reading, now: libraries that read it later word a refusal their own way
    (safetensors says "No such file or directory" for a file we may not read)."""
    try:
        open(path, "rb").close()
    except OSError as e:
        raise InferlabError(f"{path}: cannot be read ({e.strerror})") from None


def read_user_json(path: str | Path, kind: str = "file") -> Any:
    """The file's JSON value; a file that cannot be read or is not JSON is a one-line error."""
    return parse_user_json(read_user_text(path, kind), str(path))


def parse_user_json(text: str, where: str,
                    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """The JSON value of the user's `text` (a file, a line of one, an argument); text that is
    not JSON is a one-line error that starts with `where`. json.loads raises more than
    JSONDecodeError on hostile input, and each would otherwise be a traceback. Objects are
    dicts, or what `object_pairs_hook` makes of their (key, value) pairs, as in json.loads."""
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        detail = str(e)
    except RecursionError:  # the C parser's guard against the stack
        detail = "nested too deeply"
    except ValueError:  # int() refuses a literal this long (its message suggests a Python call)
        detail = f"an integer of more than {sys.get_int_max_str_digits()} digits"
    raise InferlabError(f"{where}: not valid JSON ({detail})")


def check_writable(path: str | Path, flag: str = "") -> None:
    """Open `path` as its writer will, now: a missing folder, a folder of that name or a
    place that takes no files fails before the work, not after it with the result lost.
    The errors start with `flag` and the path."""
    target = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    folder = stat_user_path(target.parent)
    if folder is None:
        raise InferlabError(f"{where}: folder {target.parent} does not exist")
    if not stat.S_ISDIR(folder.st_mode):  # a file named as a folder: "does not exist" misleads
        raise InferlabError(f"{where}: {target.parent} is not a folder")
    existed = target.exists()
    try:  # opened, not os.access, which says yes to root almost everywhere (/proc too)
        target.open("a").close()  # append: an existing file keeps its content until written
    except OSError as e:
        raise InferlabError(f"{where}: cannot write ({e.strerror})") from None
    if not existed:
        target.unlink()  # nothing left behind if the work then fails


def write_user_text(path: str | Path, text: str) -> None:
    """Write `text` to the user's `path` (a report, a result). A write that fails once the file
    is open (a full disk) removes what it left, an empty or cut-off file that would pass for a
    result, and raises the OSError for the caller to word; one the file could not even be
    opened for leaves whatever was there."""
    f = open(path, "w", encoding="utf-8")  # noqa: SIM115 -- closed below, inside the cleanup
    try:
        with f:
            f.write(text)
    except OSError:
        if os.path.isfile(path):  # a regular file: never a device (--output /dev/stdout)
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
