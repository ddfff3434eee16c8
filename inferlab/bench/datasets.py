"""Prompts from files, in the layouts guidellm reads: JSONL, JSON (a list of rows, or
ShareGPT conversations), CSV with a header, and plain text with one prompt a line.

Columns are matched as guidellm's GenerativeColumnMapper matches them: a name of its lists in
any case and in the plural, the first such column in the file's column order winning. A
row's prompt is its text column (`prompt`, `instruction`, ...) or a chat `messages` list,
after its prefix column (`system_prompt`, `system`, `prefix`): completions send
`prefix + " " + text`, chat sends the prefix as a system message first. Its output length is
its output count column (`output_tokens_count`...), else a `max_tokens` ceiling. File prompts
are sent verbatim, as guidellm and `vllm bench serve` send dataset prompts.
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from inferlab.bench.tokens import TokenCounter
from inferlab.errors import InferlabError
from inferlab.user_files import is_user_file, parse_user_json, read_user_text

# guidellm's GenerativeColumnMapper defaults
TEXT_COLUMNS = ("prompt", "instruction", "question", "input", "context", "content",
                "conversation", "turn", "text")
PREFIX_COLUMNS = ("system_prompt", "system", "prefix")
MESSAGE_COLUMNS = ("messages", "chat_messages")
# a count is the length wanted (guidellm sends it with ignore_eos); max_tokens only a ceiling
COUNT_COLUMNS = ("output_tokens", "output_tokens_count", "completion_tokens_count")
CEILING_COLUMNS = ("max_tokens",)
SUFFIXES = (".jsonl", ".json", ".csv", ".txt")
CSV_CELL_LIMIT = 1 << 30
BOM = "\ufeff"  # a byte order mark, as editors and spreadsheets save UTF-8


@dataclass(frozen=True)
class Prompt:
    """One request's content before it is serialised (and, for synthetic ones, tagged)."""

    text: str | None  # a completion prompt, or None for chat
    messages: tuple[dict, ...] | None  # chat messages, or None for a completion
    prompt_tokens: int  # as sent (with any tag and prefix): exact with a tokenizer, else estimated
    output_tokens: int | None  # max_tokens to ask for
    # where in the text (or the first user message) the request's unique tag goes; None:
    # sent verbatim
    tag_at: int | None = None
    exact_output: bool = False  # output_tokens is the length wanted (ignore_eos), not a cap
    prefix: str | None = None  # a system prompt: before the text, or chat's system message

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise ValueError("a prompt has either text or messages")


@dataclass(frozen=True)
class _Row:
    """One record of a file, and where it is, for errors."""

    where: str  # FILE:LINE
    fields: dict  # in the file's column order
    cells_are_text: bool = False  # a CSV row: counts are written as digits


def load_file(path: str, counter: TokenCounter, default_output_tokens: int) -> list[Prompt]:
    """The prompts of a .jsonl, .json, .csv or .txt file, in file order."""
    file = Path(path)
    if not is_user_file(file):
        raise InferlabError(f"--data file not found: {path}")
    suffix = file.suffix.lower()  # data.CSV is a CSV file
    if suffix not in SUFFIXES:
        raise InferlabError(f"--data file must be .jsonl, .json (rows or ShareGPT), .csv or "
                            f".txt, got {file.name}")
    text = read_user_text(file).removeprefix(BOM)
    if suffix == ".json":
        data = parse_user_json(text, file.name)
        if not isinstance(data, list):
            raise InferlabError(f"{file.name}: JSON data is a list of rows or of ShareGPT "
                                "conversations")
        if data and isinstance(data[0], dict) and "conversations" in data[0]:
            prompts = _sharegpt_prompts(data, counter)
        else:
            prompts = _row_prompts(list(_json_rows(data, file.name)), counter,
                                   default_output_tokens)
    else:
        reader = {".jsonl": _jsonl_rows, ".csv": _csv_rows, ".txt": _txt_rows}[suffix]
        prompts = _row_prompts(list(reader(text, file.name)), counter, default_output_tokens)
    if not prompts:
        raise InferlabError(f"no usable prompts in {path}")
    return prompts


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """The numbered lines of a JSONL file, split at "\\n" (with any "\\r" before it) only:
    str.splitlines also splits at U+2028, form feeds and the like, which a JSON string may
    hold."""
    for number, line in enumerate(text.split("\n"), 1):
        yield number, line.removesuffix("\r")


def _text_lines(text: str) -> Iterator[tuple[int, str]]:
    """The numbered lines of a text file as guidellm reads them (open().readlines():
    universal newlines end a line at "\\r", "\\n" or "\\r\\n", and at nothing else)."""
    for number, line in enumerate(io.StringIO(text, newline=None).readlines(), 1):
        yield number, line.removesuffix("\n")


def _jsonl_rows(text: str, name: str) -> Iterator[_Row]:
    for number, line in _lines(text):
        if not line.strip():
            continue
        record = parse_user_json(line, f"{name}:{number}")
        if not isinstance(record, dict):
            raise InferlabError(f"{name}:{number}: expected an object")
        yield _Row(f"{name}:{number}", record)


def _json_rows(data: list, name: str) -> Iterator[_Row]:
    for number, record in enumerate(data, 1):  # numbered as list items: a row spans lines
        if not isinstance(record, dict):
            raise InferlabError(f"{name}: item {number}: expected an object")
        yield _Row(f"{name}: item {number}", record)


def _csv_rows(text: str, name: str) -> Iterator[_Row]:
    # quoted cells may hold newlines; and a long-context prompt is longer than the csv
    # module's default cell limit (128 KiB), which only guards against runaway quotes
    csv.field_size_limit(max(csv.field_size_limit(), CSV_CELL_LIMIT))
    # strict: a quote left open is an error, not the rest of the file read as one cell
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = None
    while True:
        start = reader.line_num + 1  # the record's first line, for the error
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise InferlabError(f"{name}:{start}: not CSV ({e})") from None
        if not cells:  # a blank line
            continue
        if header is None:
            header = cells
            continue
        yield _Row(f"{name}:{start}", _csv_fields(header, cells), cells_are_text=True)


def _csv_fields(header: list[str], cells: list[str]) -> dict:
    """A row's cells by column name. A name the header repeats keeps its first column:
    pandas renames the repeats (`prompt.1`), which guidellm's column mapper then ignores.
    Cells past the header's are dropped; a short row's missing ones are empty."""
    fields: dict = {}
    for i, key in enumerate(header):
        fields.setdefault(key, cells[i] if i < len(cells) else "")
    return fields


def _txt_rows(text: str, name: str) -> Iterator[_Row]:
    for number, line in _text_lines(text):
        if line.strip():
            yield _Row(f"{name}:{number}", {"prompt": line})


def _row_prompts(rows: list[_Row], counter: TokenCounter,
                 default_output_tokens: int) -> list[Prompt]:
    """The rows' prompts, their fields taken in the file's column order (the order in which
    the columns first appear): where several columns match, guidellm takes the first."""
    order = dict.fromkeys(key for row in rows for key in row.fields)
    return [_row_prompt(replace(row, fields={k: row.fields[k] for k in order
                                             if k in row.fields}),
                        counter, default_output_tokens) for row in rows]


def _row_prompt(row: _Row, counter: TokenCounter, default_output_tokens: int) -> Prompt:
    output, exact = _output_tokens(row, default_output_tokens)
    prefix = _prefix(row)
    text = next((value for value in _values(row.fields, TEXT_COLUMNS)
                 if isinstance(value, str)), None)
    if text is not None:
        sent = f"{prefix} {text}" if prefix else text
        return Prompt(text, None, counter.count(sent), output, exact_output=exact,
                      prefix=prefix)
    raw = next(_values(row.fields, MESSAGE_COLUMNS), None)
    if not isinstance(raw, list):
        raise InferlabError(f"{row.where}: needs a prompt string (one of "
                            f"{', '.join(TEXT_COLUMNS)}) or a 'messages' list")
    if not raw:  # no message to send, and a server answers 400
        raise InferlabError(f"{row.where}: 'messages' is empty")
    messages = tuple(_check_message(m, row.where) for m in raw)
    contents = [m["content"] for m in messages]
    content = " ".join([prefix, *contents] if prefix else contents)
    return Prompt(None, messages, counter.count(content), output, exact_output=exact,
                  prefix=prefix)


def _prefix(row: _Row) -> str | None:
    """The row's system prompt; an empty or null one is none."""
    key = _column(row.fields, PREFIX_COLUMNS)
    value = None if key is None else row.fields[key]
    if value is not None and not isinstance(value, str):
        raise InferlabError(f"{row.where}: {key} must be a string")
    return value or None


def _output_tokens(row: _Row, default: int) -> tuple[int, bool]:
    """max_tokens for the row, and whether it is the exact length wanted (a count column)."""
    count = _column(row.fields, COUNT_COLUMNS)
    # guidellm sums only truthy counts: a null or 0 one (pandas' gap) asks no length
    if count is not None and (value := _whole_number(row, count)):
        return value, True
    ceiling = _column(row.fields, CEILING_COLUMNS)
    value = None if ceiling is None else _whole_number(row, ceiling)
    if value is None:
        return default, False
    if value < 1:  # a server refuses max_tokens 0
        raise InferlabError(f"{row.where}: {ceiling} must be a positive int")
    return value, False


def _whole_number(row: _Row, key: str) -> int | None:
    """The value of column `key` as a token count >= 0; None where it is null or an empty
    cell. 5.0 is 5: pandas writes the counts of a column with gaps as floats."""
    value = row.fields[key]
    if row.cells_are_text:
        if not value.strip():
            return None
        with contextlib.suppress(ValueError):  # not a number: refused below
            value = float(value)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    # bool is an int in Python, and a server refuses max_tokens: true
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InferlabError(f"{row.where}: {key} must be a positive int")
    return value


def _column(fields: dict, names: tuple[str, ...]) -> str | None:
    """The first of the row's keys naming one of `names`."""
    return next(_keys(fields, names), None)


def _keys(fields: dict, names: tuple[str, ...]) -> Iterator[str]:
    """The row's keys naming one of `names` as guidellm's column mapper matches them: in any
    case and in the plural (`Prompts`), in the row's order."""
    forms = {name + plural for name in names for plural in ("", "s", "es")}
    return (key for key in fields if key.lower() in forms)


def _values(fields: dict, names: tuple[str, ...]) -> Iterator[object]:
    """The values of the row's columns naming one of `names`, in the row's order."""
    return (fields[key] for key in _keys(fields, names))


def _check_message(message: object, where: str) -> dict:
    if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)):
        raise InferlabError(f"{where}: each message needs 'role' and 'content' strings")
    return {"role": message["role"], "content": message["content"]}


def _sharegpt_prompts(data: list, counter: TokenCounter) -> list[Prompt]:
    """The first human turn is the prompt; the reply's length is the output length."""
    prompts = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)
                and first.get("from") == "human" and reply.get("from") == "gpt"):
            continue
        question, answer = first.get("value"), reply.get("value")
        # a null or missing value is no text: skipped as an empty one is, not sent as "None"
        if not (isinstance(question, str) and isinstance(answer, str)
                and question.strip() and answer.strip()):
            continue
        message = {"role": "user", "content": question}
        prompts.append(Prompt(None, (message,), counter.count(question),
                              max(1, counter.count(answer))))
    return prompts
