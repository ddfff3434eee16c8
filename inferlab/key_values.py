"""The user's `key=value` items (`--data prompt_tokens=8,output_tokens=2`, `--slo ttft_ms=500`,
`--header NAME:VALUE`), split one way everywhere: a malformed item is one line that names the
flag and quotes the item. Each caller converts and checks the values itself."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from inferlab.errors import InferlabError


def key_value_items(items: Iterable[str], flag: str, form: str = "key=value", sep: str = "=",
                    keys: Collection[str] | None = None) -> dict[str, str]:
    """Each item's key -> value, both stripped, in the order given. An item without `sep`, with
    an empty key or (where `keys` are given) a key outside them does not read as `form`; a key
    given twice is refused too, as its second value would silently replace the first."""
    pairs: dict[str, str] = {}
    for item in items:
        key, found, value = (part.strip() for part in item.partition(sep))
        if not found or not key or (keys is not None and key not in keys):
            raise InferlabError(f"bad {flag} item {item!r}: expected {form}")
        if key in pairs:
            raise InferlabError(f"bad {flag} item {item!r}: {key} is given twice")
        pairs[key] = value
    return pairs


def key_value_list(text: str, flag: str, form: str = "key=value",
                   keys: Collection[str] | None = None) -> dict[str, str]:
    """`a=1,b=2` -> {'a': '1', 'b': '2'}, as `key_value_items`; empty items (a trailing comma,
    an empty `text`) are skipped."""
    return key_value_items(filter(None, (part.strip() for part in text.split(","))), flag, form,
                           keys=keys)
