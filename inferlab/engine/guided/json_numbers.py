"""Numbers held to a schema's bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) one
character at a time: which number prefixes can still end inside the bounds, so that guided
decoding never walks into a number it cannot finish.

A bounded number is written without an exponent, and one with a fraction in at most
FLOAT_DIGITS digits (not counting the 0 of 0.xxx): decimals of up to 15 significant digits keep
their order as doubles, so a value inside the bounds here is inside them for a validator that
reads it as a float (jsonschema, JavaScript) too; with 20 digits, "0.09999999999999999999" reads
as 0.1 and would break exclusiveMaximum 0.1. An integer literal (no fraction), under type
integer or number, has no such limit: Python's json and jsonschema keep it exact, so minimum
1e20 takes 100000000000000000000 (a reader of doubles rounds integers past 2**53, which keeps
minimum and maximum but can meet an exclusive bound).

Arithmetic is exact (Fraction); a bound is taken as its shortest decimal spelling (str), the
number a validator reading the schema as JSON compares against.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from fractions import Fraction

FLOAT_DIGITS = 15


@dataclass(frozen=True)
class Bound:
    value: Fraction
    strict: bool  # an exclusive bound


@dataclass(frozen=True)
class NumberBounds:
    low: Bound | None
    high: Bound | None
    integer: bool

    def may_end(self, text: str) -> bool:
        """The whole number `text` ("-12.5") lies inside the bounds."""
        past = self._past_the_bounds(text)
        if past is not None:
            return past
        exact = self.integer or "." not in text or _digits(text) <= FLOAT_DIGITS
        return exact and _inside(Fraction(text), self.low, self.high)

    def reachable(self, text: str) -> bool:
        """Some number the grammar can still write after the prefix `text` ("", "-", "12",
        "12.", "12.5"; no exponent) lies inside the bounds."""
        past = self._past_the_bounds(text)
        if past is not None:
            return past
        if not self.integer and "." not in text and replace(self, integer=True).reachable(text):
            return True  # an integer literal, exact at any length
        negative = text.startswith("-")
        body = text[negative:]
        if not body:  # a sign, then a first digit; or before it all, a sign or not
            starts = ("-" if text == "" else "") + "0123456789"
            return any(self.reachable(text + start) for start in starts)
        left = 0 if self.integer else FLOAT_DIGITS - _digits(body)  # digits still to come
        if left < 0:
            return False
        # a negative number's magnitude lies in the bounds turned around
        low, high = (_negated(self.high), _negated(self.low)) if negative else (self.low, self.high)
        whole, dot, fraction = body.partition(".")
        if dot:  # [whole.fraction, + one unit of its last digit), on the grid of the digits left
            if not fraction and left == 0:
                return False  # a dot needs a digit after it
            start, unit = Fraction(whole + "." + (fraction or "0")), Fraction(1, 10 ** len(fraction))
            return _grid_meets(start, start + unit, unit / 10 ** left, low, high)
        if whole == "0":  # 0, or 0.xxx
            return _grid_meets(Fraction(0), Fraction(1), Fraction(1, 10 ** left), low, high)
        return _longer_meets(int(whole), left, self.integer, low, high)

    @functools.cached_property
    def _bound_digits(self) -> int:
        """The integer digits of the longer bound (asked at every character of a number)."""
        return max(map(_integer_digits, (self.low, self.high)))

    def _past_the_bounds(self, text: str) -> bool | None:
        """For an integer literal longer than every bound (it and whatever more digits follow
        lie beyond them all): whether that side is open. None for any other text. Such a text
        is never read as a number, which Python refuses past 4300 digits (a ValueError that
        once ended the engine) and reads in time quadratic in its length."""
        whole = text.removeprefix("-")
        if "." in whole or len(whole) <= self._bound_digits + 1:
            return None
        return (self.low if text.startswith("-") else self.high) is None


def _integer_digits(bound: Bound | None) -> int:
    return 0 if bound is None else len(str(abs(bound.value.numerator) // bound.value.denominator))


def _longer_meets(whole: int, left: int, integer: bool, low: Bound | None, high: Bound | None) -> bool:
    """Integer part `whole` followed by k more digits (k = 0, 1, ...): magnitudes in
    [whole * 10^k, (whole + 1) * 10^k), on the grid of the fraction digits left after them."""
    k = 0
    while integer or k <= left:
        start = whole * 10 ** k
        if high is not None and start > high.value:
            return False  # more digits only go further past it
        step = Fraction(1) if integer else Fraction(1, 10 ** (left - k))
        if _grid_meets(Fraction(start), Fraction((whole + 1) * 10 ** k), step, low, high):
            return True  # an integer's loop ends here once start passes the low bound
        k += 1
    return False


def _grid_meets(start: Fraction, end: Fraction, step: Fraction, low: Bound | None,
                high: Bound | None) -> bool:
    """Some start + j * step (j >= 0) short of `end` lies inside [low, high]."""
    value = start
    if low is not None and (low.value > start or (low.value == start and low.strict)):
        jumps = -((start - low.value) // step)  # ceil((low - start) / step)
        value = start + jumps * step
        if value == low.value and low.strict:
            value += step
    return value < end and _inside(value, None, high)


def _inside(value: Fraction, low: Bound | None, high: Bound | None) -> bool:
    above = low is None or value > low.value or (value == low.value and not low.strict)
    below = high is None or value < high.value or (value == high.value and not high.strict)
    return above and below


def _negated(bound: Bound | None) -> Bound | None:
    return None if bound is None else Bound(-bound.value, bound.strict)


def _digits(text: str) -> int:
    """The digits that count toward FLOAT_DIGITS: all but the 0 of "0.xxx"."""
    body = text.lstrip("-")
    return sum(ch.isdigit() for ch in body) - body.startswith("0")
