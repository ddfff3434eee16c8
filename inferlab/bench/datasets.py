"""Prompts from files, in the layouts guidellm reads: JSONL, JSON (a list of rows, or
ShareGPT conversations), CSV with a header, and plain text with one prompt a line.

A row's prompt is the first of guidellm's text columns it has (`prompt`, `instruction`, ...)
or a chat `messages` list; its output length is the first output count column it has
(`output_tokens`, guidellm's `output_tokens_count`...). File prompts are sent verbatim, as
guidellm and `vllm bench serve` send dataset prompts.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from inferlab.bench.tokens import TokenCounter
from inferlab.errors import InferlabError
from inferlab.user_files import read_user_json, read_user_text

# guidellm's GenerativeColumnMapper defaults, in its order of preference
TEXT_COLUMNS = ("prompt", "instruction", "question", "input", "context", "content",
                "conversation", "turn", "text")
MESSAGE_COLUMNS = ("messages", "chat_messages")
# a count is the length wanted (guidellm sends it with ignore_eos); max_tokens only a ceiling
COUNT_COLUMNS = ("output_tokens", "output_tokens_count", "completion_tokens_count")
CEILING_COLUMNS = ("max_tokens",)
SUFFIXES = (".jsonl", ".json", ".csv", ".txt")
CSV_CELL_LIMIT = 1 << 30


@dataclass(frozen=True)
class Prompt:
    """One request's content before it is serialised (and, for synthetic ones, tagged)."""

    text: str | None  # a completion prompt, or None for chat
    messages: tuple[dict, ...] | None  # chat messages, or None for a completion
    prompt_tokens: int  # as sent (with any tag): exact with a tokenizer, else estimated
    output_tokens: int | None  # max_tokens to ask for
    # where in the text (or the first user message) the request's unique tag goes; None:
    # sent verbatim
    tag_at: int | None = None
    exact_output: bool = False  # output_tokens is the length wanted (ignore_eos), not a cap

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise ValueError("a prompt has either text or messages")


@dataclass(frozen=True)
class _Row:
    """One record of a file, and where it is, for errors."""

    where: str  # FILE:LINE
    fields: dict
    cells_are_text: bool = False  # a CSV row: counts are written as digits


def load_file(path: str, counter: TokenCounter, default_output_tokens: int) -> list[Prompt]:
    """The prompts of a .jsonl, .json, .csv or .txt file, in file order."""
    file = Path(path)
    if not file.is_file():
        raise InferlabError(f"--data file not found: {path}")
    if file.suffix not in SUFFIXES:
        raise InferlabError(f"--data file must be .jsonl, .json (rows or ShareGPT), .csv or "
                            f".txt, got {file.name}")
    if file.suffix == ".json":
        data = read_user_json(file)
        if not isinstance(data, list):
            raise InferlabError(f"{file.name}: JSON data is a list of rows or of ShareGPT "
                                "conversations")
        if data and isinstance(data[0], dict) and "conversations" in data[0]:
            prompts = _sharegpt_prompts(data, counter)
        else:
            prompts = [_row_prompt(row, counter, default_output_tokens)
                       for row in _json_rows(data, file.name)]
    else:
        reader = {".jsonl": _jsonl_rows, ".csv": _csv_rows, ".txt": _txt_rows}[file.suffix]
        prompts = [_row_prompt(row, counter, default_output_tokens)
                   for row in reader(read_user_text(file), file.name)]
    if not prompts:
        raise InferlabError(f"no usable prompts in {path}")
    return prompts


def _jsonl_rows(text: str, name: str) -> Iterator[_Row]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InferlabError(f"{name}:{number}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise InferlabError(f"{name}:{number}: expected an object")
        yield _Row(f"{name}:{number}", record)


def _json_rows(data: list, name: str) -> Iterator[_Row]:
    for number, record in enumerate(data, 1):  # numbered as list items: a row spans lines
        if not isinstance(record, dict):
            raise InferlabError(f"{name}: item {number}: expected an object")
        yield _Row(f"{name}: item {number}", record)


def _csv_rows(text: str, name: str) -> Iterator[_Row]:
    # a spreadsheet's UTF-8 byte order mark would be part of the first column's name
    text = text.removeprefix("\ufeff")
    # quoted cells may hold newlines; and a long-context prompt is longer than the csv
    # module's default cell limit (128 KiB), which only guards against runaway quotes
    csv.field_size_limit(max(csv.field_size_limit(), CSV_CELL_LIMIT))
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for record in reader:
            # cells past the header's go under None; a short row's missing ones are None
            fields = {k: v or "" for k, v in record.items() if k is not None}
            yield _Row(f"{name}:{reader.line_num}", fields, cells_are_text=True)
    except csv.Error as e:
        raise InferlabError(f"{name}:{reader.line_num}: not CSV ({e})") from None


def _txt_rows(text: str, name: str) -> Iterator[_Row]:
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            yield _Row(f"{name}:{number}", {"prompt": line})


def _row_prompt(row: _Row, counter: TokenCounter, default_output_tokens: int) -> Prompt:
    output, exact = _output_tokens(row, default_output_tokens)
    text = next((value for value in _values(row.fields, TEXT_COLUMNS)
                 if isinstance(value, str)), None)
    if text is not None:
        return Prompt(text, None, counter.count(text), output, exact_output=exact)
    raw = next(_values(row.fields, MESSAGE_COLUMNS), None)
    if not isinstance(raw, list):
        raise InferlabError(f"{row.where}: needs a prompt string (one of "
                            f"{', '.join(TEXT_COLUMNS)}) or a 'messages' list")
    if not raw:  # no message to send, and a server answers 400
        raise InferlabError(f"{row.where}: 'messages' is empty")
    messages = tuple(_check_message(m, row.where) for m in raw)
    content = " ".join(m["content"] for m in messages)
    return Prompt(None, messages, counter.count(content), output, exact_output=exact)


def _output_tokens(row: _Row, default: int) -> tuple[int, bool]:
    """max_tokens for the row, and whether it is the exact length wanted (a count column)."""
    for column in COUNT_COLUMNS + CEILING_COLUMNS:
        key = _key(row.fields, column)
        if key is None:
            continue
        value = row.fields[key]
        if row.cells_are_text:
            if not value.strip():
                continue  # an empty cell gives no count
            value = int(value) if value.strip().isdecimal() else value
        # bool is an int in Python, and a server refuses max_tokens: true
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InferlabError(f"{row.where}: {key} must be a positive int")
        return value, column in COUNT_COLUMNS
    return default, False


def _key(fields: dict, name: str) -> str | None:
    """The row's key for column `name`, matched as guidellm matches column names: in any
    case, and in the plural."""
    keys = {key.lower(): key for key in fields}
    return next((keys[form] for form in (name, name + "s", name + "es") if form in keys), None)


def _values(fields: dict, names: tuple[str, ...]) -> Iterator[object]:
    """The values of the columns of `names` the row has, in that order."""
    for name in names:
        key = _key(fields, name)
        if key is not None:
            yield fields[key]


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
