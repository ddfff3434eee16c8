"""What `inferlab eval` measures and how: one frozen dataclass, checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.config import DTYPES
from inferlab.errors import InferlabError
from inferlab.shared_data import WIKITEXT_TEST

DEFAULT_DATASET = str(WIKITEXT_TEST)
EVAL_DTYPES = tuple(d for d in DTYPES if d != "float16")


@dataclass(frozen=True)
class EvalConfig:
    model: str | None = None  # HF directory or .gguf; None: the embedded SmolLM2-135M
    baseline: str | None = None  # compare against this model: KL divergence, top-1 agreement
    dataset: str = DEFAULT_DATASET  # any UTF-8 text file, read whole
    seq_len: int = 2048  # tokens per non-overlapping window
    limit: int | None = None  # score only the first `limit` windows
    dtype: str = "auto"  # of both models; auto: as the engine picks (bf16 where the CPU is fast at it)
    device: str = "auto"
    via_engine: bool = False  # perplexity from the serving engine's prompt logprobs
    output: str | None = None  # JSON result file

    def __post_init__(self) -> None:
        checks = [
            (self.seq_len >= 2, f"--seq-len must be at least 2 (a window predicts tokens "
                                f"1..L-1), got {self.seq_len}"),
            (self.limit is None or self.limit >= 1, f"--limit must be at least 1, got {self.limit}"),
            (self.output is None or self.output.strip() != "", "--output must name a file"),
            (self.dtype in EVAL_DTYPES,
             f"--dtype must be one of {', '.join(EVAL_DTYPES)}, got {self.dtype!r}"),
            (self.device in ("auto", "cpu", "cuda"),
             f"--device must be auto, cpu or cuda, got {self.device!r}"),
            (not (self.via_engine and self.baseline),
             "--via-engine gives only the prompt tokens' logprobs; KL against --baseline needs "
             "the full distributions, so run it without --via-engine"),
        ]
        for ok, message in checks:
            if not ok:
                raise InferlabError(message)
