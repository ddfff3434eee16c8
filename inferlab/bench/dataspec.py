"""The `--data` argument: a synthetic length spec (guidellm's `key=value` or JSON form), or a
file of prompts."""

from __future__ import annotations

import contextlib
import math
import random
import stat
from dataclasses import dataclass
from pathlib import Path

from inferlab.errors import InferlabError
from inferlab.key_values import bad_value, key_value_list, key_value_object
from inferlab.shared_data import WIKITEXT_TEST
from inferlab.user_files import stat_user_path

DEFAULT_CORPUS = WIKITEXT_TEST
# past the longest context windows served: a bigger length is a typo (1e10), and cutting
# prompts of it would fill the memory
MAX_TOKENS = 1 << 20
KNOWN_KEYS = tuple(f"{base}{suffix}" for base in ("prompt_tokens", "output_tokens")
                   for suffix in ("", "_stdev", "_min", "_max")) + ("prefix_tokens",)
# guidellm spec keys that name something this tool takes another way
KEY_HINTS = {"source": "the text synthetic prompts are cut from is --data-file"}


@dataclass(frozen=True)
class LengthDist:
    """A token length, as guidellm's IntegerRangeSampler draws it: normal around `mean` and
    clipped to [min, max] with a stdev; without one, uniform over [min, max] (a bound not
    given is the mean). At least 1 and at most MAX_TOKENS."""

    mean: int
    stdev: float = 0.0
    min: int | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        if self.mean < 0 or self.stdev < 0:
            raise InferlabError(f"token lengths must be >= 0, got mean {self.mean} "
                                f"stdev {self.stdev}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise InferlabError(f"token length min {self.min} exceeds max {self.max}")

    @property
    def uniform(self) -> tuple[int, int] | None:
        """The range sampled uniformly, or None when the length is normal or fixed."""
        low = self.mean if self.min is None else self.min
        high = self.mean if self.max is None else self.max
        return (low, high) if not self.stdev and low < high else None

    @property
    def typical(self) -> int:
        """A representative length, to size what is held in memory."""
        if self.uniform is not None:
            return sum(self.uniform) // 2
        return max(self.mean, self.min or 0)

    def sample(self, rng: random.Random) -> int:
        if self.uniform is not None:
            value = rng.randint(*self.uniform)
        else:
            value = round(rng.gauss(self.mean, self.stdev)) if self.stdev else self.mean
        value = min(MAX_TOKENS, value)  # a wide stdev must not ask for more than the bound
        if self.min is not None:
            value = max(self.min, value)
        if self.max is not None:
            value = min(self.max, value)
        return max(1, value)


@dataclass(frozen=True)
class SyntheticSpec:
    """`prompt_tokens=256,output_tokens=128[,prompt_tokens_stdev=..,_min,_max][,prefix_tokens=N]`,
    or the same keys as a JSON object.

    The shared prefix of `prefix_tokens` is prepended to every prompt, on top of its
    `prompt_tokens` unique tokens.
    """

    prompt: LengthDist
    output: LengthDist
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prefix_tokens < 0:
            raise InferlabError(f"prefix_tokens must be >= 0, got {self.prefix_tokens}")
        # a request asks for at least one token: lower ones would silently be sent as 1; and
        # guidellm's bounds are > 0 (a bound of 0 would pile the draws at 1)
        for key, value in (("output_tokens", self.output.mean),
                           ("output_tokens_min", self.output.min),
                           ("output_tokens_max", self.output.max),
                           ("prompt_tokens_min", self.prompt.min),
                           ("prompt_tokens_max", self.prompt.max)):
            if value is not None and value < 1:
                raise InferlabError(f"--data {key} must be >= 1, got {value}")

    @classmethod
    def parse(cls, text: str) -> SyntheticSpec:
        """guidellm's forms: `prompt_tokens=256,output_tokens=128` or the same as a JSON
        object."""
        fields: dict[str, float] = {}
        for key, value in _spec_items(text):
            if key not in KNOWN_KEYS:  # before the value: "source=x.txt" is no bad number
                hint = f" ({KEY_HINTS[key]})" if key in KEY_HINTS else ""
                raise InferlabError(f"unknown --data key {key!r}{hint}; known: "
                                    f"{', '.join(KNOWN_KEYS)}")
            fields[key] = _spec_number(key, value)
            # guidellm declares the lengths ints: 100.5 tokens is a typo, not 100
            if not key.endswith("_stdev") and not fields[key].is_integer():
                raise InferlabError(f"--data {key} must be a whole number of tokens, "
                                    f"got {value}")
        for base in ("prompt_tokens", "output_tokens"):
            if base not in fields:
                raise InferlabError(f"--data needs {base}=N (got {text!r})")

        def dist(base: str) -> LengthDist:
            def opt(suffix: str) -> int | None:
                value = fields.get(base + suffix)
                return None if value is None else int(value)

            return LengthDist(int(fields[base]), fields.get(base + "_stdev", 0.0),
                              opt("_min"), opt("_max"))

        return cls(dist("prompt_tokens"), dist("output_tokens"),
                   int(fields.get("prefix_tokens", 0)))


def _spec_items(text: str) -> list[tuple[str, object]]:
    """The spec's (key, value) pairs, from `k=v,k=v` or a JSON object."""
    if text.lstrip().startswith("{"):
        return list(key_value_object(text, "--data").items())
    return list(key_value_list(text, "--data").items())


def _spec_number(key: str, value: object) -> float:
    """`value` as a finite token count; NaN, inf, bools and non-numbers are refused."""
    number = math.nan  # refused below, as float() lets nan and inf through
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):  # an int of hundreds of digits
            number = float(value)
    if not math.isfinite(number):
        raise bad_value("--data", key, value, "a token count")
    if number > MAX_TOKENS:
        raise InferlabError(f"--data {key} must be at most {MAX_TOKENS:,} tokens, got {value}")
    return number


def is_synthetic(data: str) -> bool:
    """A spec has `key=value` items or is a JSON object, and is not the name of an existing
    file (a spec longer than a file name can be names none)."""
    return ("=" in data or data.lstrip().startswith("{")) and stat_user_path(data) is None


def resolve_corpus(path: str | None) -> Path:
    """The text synthetic prompts are cut from: --data-file, else WikiText-2 test."""
    if path is not None:
        found = stat_user_path(path)
        if found is not None and stat.S_ISDIR(found.st_mode):
            raise InferlabError(f"--data-file {path}: is a directory, not a text file")
        if found is None or not stat.S_ISREG(found.st_mode):
            raise InferlabError(f"--data-file not found: {path}")
        return Path(path)
    if not DEFAULT_CORPUS.is_file():
        raise InferlabError(
            f"synthetic prompts are cut from real text, by default {DEFAULT_CORPUS}, "
            "which is missing; point --data-file at any UTF-8 text file")
    return DEFAULT_CORPUS
