"""Prompts from files: JSONL of `prompt`/`messages` records, or ShareGPT JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inferlab.bench.tokens import TokenCounter
from inferlab.errors import InferlabError
from inferlab.user_files import read_user_json, read_user_text


@dataclass(frozen=True)
class Prompt:
    """One request's content before it is made unique and serialised."""

    text: str | None  # a completion prompt, or None for chat
    messages: tuple[dict, ...] | None  # chat messages, or None for a completion
    prompt_tokens: int  # with the unique tag: exact with a tokenizer, else estimated
    output_tokens: int | None  # max_tokens to ask for
    tag_at: int = 0  # where in the text (or the first user message) the unique tag goes

    def __post_init__(self) -> None:
        if (self.text is None) == (self.messages is None):
            raise ValueError("a prompt has either text or messages")


def load_file(path: str, counter: TokenCounter, default_output_tokens: int) -> list[Prompt]:
    """JSONL (`.jsonl`) or ShareGPT (`.json`) prompts, in file order."""
    file = Path(path)
    if not file.is_file():
        raise InferlabError(f"--data file not found: {path}")
    if file.suffix == ".jsonl":
        prompts = _load_jsonl(file, counter, default_output_tokens)
    elif file.suffix == ".json":
        prompts = _load_sharegpt(file, counter)
    else:
        raise InferlabError(f"--data file must be .jsonl (prompt/messages records) or .json "
                            f"(ShareGPT), got {file.name}")
    if not prompts:
        raise InferlabError(f"no usable prompts in {path}")
    return prompts


def _load_jsonl(file: Path, counter: TokenCounter, default_output_tokens: int) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(read_user_text(file).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InferlabError(f"{file.name}:{number}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise InferlabError(f"{file.name}:{number}: expected an object")
        output = record.get("output_tokens", record.get("max_tokens", default_output_tokens))
        if not isinstance(output, int) or output < 1:
            raise InferlabError(f"{file.name}:{number}: output_tokens must be a positive int")
        if isinstance(record.get("prompt"), str):
            prompts.append(Prompt(record["prompt"], None, counter.count_tagged(record["prompt"]),
                                  output))
        elif isinstance(record.get("messages"), list):
            messages = tuple(_check_message(m, file.name, number) for m in record["messages"])
            text = " ".join(m["content"] for m in messages)
            prompts.append(Prompt(None, messages, counter.count_tagged(text), output))
        else:
            raise InferlabError(f"{file.name}:{number}: needs a 'prompt' string or a "
                                "'messages' list")
    return prompts


def _check_message(message: object, name: str, number: int) -> dict:
    if (not isinstance(message, dict) or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)):
        raise InferlabError(f"{name}:{number}: each message needs 'role' and 'content' strings")
    return {"role": message["role"], "content": message["content"]}


def _load_sharegpt(file: Path, counter: TokenCounter) -> list[Prompt]:
    """The first human turn is the prompt; the reply's length is the output length."""
    data = read_user_json(file)
    if not isinstance(data, list):
        raise InferlabError(f"{file.name}: ShareGPT data is a list of conversations")
    prompts = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not (isinstance(first, dict) and isinstance(reply, dict)
                and first.get("from") == "human" and reply.get("from") == "gpt"):
            continue
        question, answer = str(first.get("value", "")), str(reply.get("value", ""))
        if not question.strip() or not answer.strip():
            continue
        message = {"role": "user", "content": question}
        prompts.append(Prompt(None, (message,), counter.count_tagged(question),
                              max(1, counter.count(answer))))
    return prompts
