"""Byte sizes in and out: `64MiB`, `80GB`, `1.5 GiB` -> int; int -> `1.50 GiB`."""

from __future__ import annotations

import re

from inferlab.errors import InferlabError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, what: str = "size") -> int:
    """`64MiB` -> 67108864; decimal units (GB) are powers of 10, binary ones (GiB) powers of 2."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise InferlabError(f"{what}: cannot read {text!r} as a size (examples: 64MiB, 80GB, 1.5GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


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
