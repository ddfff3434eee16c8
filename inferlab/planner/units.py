"""Byte sizes in and out: `64MiB`, `80GB` -> int; int -> `1.50 GiB`; rates with SI prefixes."""

from __future__ import annotations

from inferlab.config import parse_bytes as config_parse_bytes
from inferlab.errors import InferlabError


def parse_bytes(text: str | int, what: str = "size") -> int:
    """`64MiB` -> 67108864, with the engine's parser (one grammar for sizes); errors name `what`."""
    try:
        return config_parse_bytes(text)
    except InferlabError as e:
        raise InferlabError(f"{what}: {e}") from None


def format_bytes(n: float) -> str:
    """Binary units, two decimals: 1.50 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def format_rate(n: float, unit: str) -> str:
    """Decimal prefixes for rates: 3.35 TB/s, 989 TFLOP/s."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}"
