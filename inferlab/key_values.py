"""The user's `key=value` items (`--data prompt_tokens=8,output_tokens=2`, `--slo ttft_ms=500`,
`--header NAME:VALUE`), split one way everywhere: a malformed item is one line that names the
flag and quotes the item. Each caller converts and checks the values itself."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
from typing import Any

from inferlab.errors import InferlabError
from inferlab.user_files import parse_user_json


def key_value_items(items: Iterable[str], flag: str, form: str = "key=value", sep: str = "=",
                    keys: Collection[str] | None = None, any_case: bool = False) -> dict[str, str]:
    """Each item's key -> value, both stripped, in the order given. An item without `sep`, with
    an empty key or (where `keys` are given) a key outside them does not read as `form`; a key
    given twice is refused too, as its second value would silently replace the first (or, for
    HTTP headers, go out beside it: `any_case` keys differ in more than case)."""
    pairs: dict[str, str] = {}
    seen: set[str] = set()
    for item in items:
        key, found, value = (part.strip() for part in item.partition(sep))
        if not found or not key or (keys is not None and key not in keys):
            raise InferlabError(f"bad {flag} item {item!r}: expected {form}")
        _refuse_repeat(key, key.lower() if any_case else key, seen, flag, item)
        pairs[key] = value
    return pairs


def bad_value(flag: str, key: str, value: object, expected: str) -> InferlabError:
    """The one error for an item whose value the flag cannot take, worded alike for all."""
    return InferlabError(f"bad {flag} value for {key}: {value!r} (expected {expected})")


def key_value_object(text: str, flag: str) -> dict[str, Any]:
    """The members of the JSON object `text` (`{"a": 1, "b": 2}`, the JSON form of `a=1,b=2`),
    a key given twice refused as key_value_items refuses it: json.loads keeps its last value."""
    members: dict[str, Any] = {}
    seen: set[str] = set()
    value = parse_user_json(text, flag, object_pairs_hook=tuple)
    if not isinstance(value, tuple):
        raise InferlabError(f"{flag}: expected a JSON object, got {text!r}")
    for key, member in value:
        _refuse_repeat(key, key, seen, flag, f"{json.dumps(key)}: {json.dumps(member)}")
        members[key] = member
    return members


def _refuse_repeat(key: str, same_as: str, seen: set[str], flag: str, item: str) -> None:
    """Refuse `item` if a key it is the same as (`same_as`: the key, or its case folded) is in
    `seen`; else add it there."""
    if same_as in seen:
        raise InferlabError(f"bad {flag} item {item!r}: {key} is given twice")
    seen.add(same_as)


def key_value_list(text: str, flag: str, form: str = "key=value",
                   keys: Collection[str] | None = None) -> dict[str, str]:
    """`a=1,b=2` -> {'a': '1', 'b': '2'}, as `key_value_items`; empty items (a trailing comma,
    an empty `text`) are skipped."""
    return key_value_items(filter(None, (part.strip() for part in text.split(","))), flag, form,
                           keys=keys)
