"""The `--data` argument: a synthetic length spec, or a JSONL / ShareGPT file."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from inferlab.errors import InferlabError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = PROJECT_ROOT.parent / "shared/data/wikitext-2-raw/wiki.test.raw"
# past the longest context windows served: a bigger length is a typo (1e10), and cutting
# prompts of it would fill the memory
MAX_TOKENS = 1 << 20


@dataclass(frozen=True)
class LengthDist:
    """A token length: normal around `mean`, clipped to [min, max], at least 1 and at most
    MAX_TOKENS."""

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

    def sample(self, rng: random.Random) -> int:
        value = round(rng.gauss(self.mean, self.stdev)) if self.stdev else self.mean
        value = min(MAX_TOKENS, value)  # a wide stdev must not ask for more than the bound
        if self.min is not None:
            value = max(self.min, value)
        if self.max is not None:
            value = min(self.max, value)
        return max(1, value)


@dataclass(frozen=True)
class SyntheticSpec:
    """`prompt_tokens=256,output_tokens=128[,prompt_tokens_stdev=..,_min,_max][,prefix_tokens=N]`.

    The shared prefix of `prefix_tokens` is prepended to every prompt, on top of its
    `prompt_tokens` unique tokens.
    """

    prompt: LengthDist
    output: LengthDist
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prefix_tokens < 0:
            raise InferlabError(f"prefix_tokens must be >= 0, got {self.prefix_tokens}")
        # a request asks for at least one token: lower ones would silently be sent as 1
        for key, value in (("output_tokens", self.output.mean),
                           ("output_tokens_max", self.output.max)):
            if value is not None and value < 1:
                raise InferlabError(f"--data {key} must be >= 1, got {value}")

    @classmethod
    def parse(cls, text: str) -> SyntheticSpec:
        fields: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise InferlabError(f"bad --data item {item!r}: expected key=value")
            try:
                number = float(value)
            except ValueError:
                number = math.nan  # refused below, as float() lets nan and inf through
            if not math.isfinite(number):
                raise InferlabError(f"bad --data value for {key}: {value!r}")
            if number > MAX_TOKENS:
                raise InferlabError(f"--data {key.strip()} must be at most {MAX_TOKENS:,} tokens, "
                                    f"got {value.strip()}")
            fields[key.strip()] = number
        known = {f"{base}{suffix}" for base in ("prompt_tokens", "output_tokens")
                 for suffix in ("", "_stdev", "_min", "_max")} | {"prefix_tokens"}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InferlabError(f"unknown --data keys {unknown}; known: {sorted(known)}")
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


def is_synthetic(data: str) -> bool:
    """A spec has `key=value` items and is not the name of an existing file."""
    return "=" in data and not Path(data).exists()


def resolve_corpus(path: str | None) -> Path:
    """The text synthetic prompts are cut from: --data-file, else WikiText-2 test."""
    if path is not None:
        corpus = Path(path)
        if corpus.is_dir():
            raise InferlabError(f"--data-file {path}: is a directory, not a text file")
        if not corpus.is_file():
            raise InferlabError(f"--data-file not found: {path}")
        return corpus
    if not DEFAULT_CORPUS.is_file():
        raise InferlabError(
            f"synthetic prompts are cut from real text, by default {DEFAULT_CORPUS}, "
            "which is missing; point --data-file at any UTF-8 text file")
    return DEFAULT_CORPUS
