"""The data the design's layout puts beside the project root (../shared/data): the WikiText-2
texts that eval, quantize's calibration, bench and the benchmarks read by default."""

from __future__ import annotations

from pathlib import Path

SHARED_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WIKITEXT_TEST = SHARED_DATA_DIR / "wikitext-2-raw" / "wiki.test.raw"
WIKITEXT_VALID = SHARED_DATA_DIR / "wikitext-2-valid" / "valid.txt"
