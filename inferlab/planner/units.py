"""Byte sizes and rates out: int -> `1.50 GiB`; rates with SI prefixes (sizes in: config.parse_bytes,
the engine's grammar)."""

from __future__ import annotations


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
