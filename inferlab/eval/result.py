"""Running totals over windows, and the result a run reports (console and JSON)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from inferlab.errors import InferlabError
from inferlab.eval.metrics import WindowScores
from inferlab.user_files import write_user_text


@dataclass
class Tally:
    """Sums over the windows scored so far; per-token KL values are kept for the percentiles."""

    windows: int = 0
    tokens: int = 0  # predicted tokens: (seq_len - 1) per window
    nll_sum: float = 0.0
    baseline_nll_sum: float = 0.0
    top1_same: int = 0
    kl_parts: list[torch.Tensor] = field(default_factory=list)  # float64 [L-1] per window

    def add(self, scores: WindowScores) -> None:
        self.windows += 1
        self.tokens += scores.nll.numel()
        self.nll_sum += float(scores.nll.sum())
        if scores.kl is not None:
            self.baseline_nll_sum += float(scores.baseline_nll.sum())
            self.top1_same += int(scores.top1_same.sum())
            self.kl_parts.append(scores.kl)

    @property
    def ppl(self) -> float:
        return exp_or_inf(self.nll_sum / self.tokens)


def exp_or_inf(mean_nll: float) -> float:
    """Perplexity from a mean NLL: inf past what a float holds (a broken model's NLL in the
    thousands), where math.exp raises OverflowError."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf


@dataclass
class EvalResult:
    model: str
    dataset: str
    seq_len: int
    dtype: str
    via_engine: bool
    windows: int
    tokens: int  # predicted tokens scored
    nll: float  # mean negative log-likelihood per predicted token, nats
    ppl: float  # exp(nll)
    elapsed_s: float  # scoring time, loading excluded
    model_path: str = ""  # absolute, as resolved: two runs/*/model folders share `model`, not this
    baseline: str | None = None
    baseline_path: str | None = None
    baseline_nll: float | None = None
    baseline_ppl: float | None = None
    kl_mean: float | None = None  # mean over tokens of KL(p_baseline || p_model), nats
    kl_median: float | None = None
    kl_p99: float | None = None  # 99th percentile of per-token KL (linear interpolation)
    kl_max: float | None = None
    top1_agreement: float | None = None  # share of tokens where both models' argmax agree

    def to_dict(self) -> dict:
        """All fields; the baseline ones only when there is a baseline."""
        return {k: v for k, v in asdict(self).items() if v is not None or self.baseline is not None}


def kl_summary(tally: Tally) -> dict[str, float]:
    """Mean, median, p99 and max of the per-token KL values, plus top-1 agreement."""
    kl = torch.cat(tally.kl_parts).numpy()  # [tokens]
    median, p99 = np.percentile(kl, [50, 99])
    return dict(baseline_nll=tally.baseline_nll_sum / tally.tokens,
                baseline_ppl=exp_or_inf(tally.baseline_nll_sum / tally.tokens),
                kl_mean=float(kl.mean()), kl_median=float(median), kl_p99=float(p99),
                kl_max=float(kl.max()), top1_agreement=tally.top1_same / tally.tokens)


def write_json(result: EvalResult, path: str) -> None:
    """The result as strict JSON: an inf or NaN figure (a broken model's) is null there."""
    fields = {k: None if isinstance(v, float) and not math.isfinite(v) else v
              for k, v in result.to_dict().items()}
    try:
        write_user_text(path, json.dumps(fields, indent=2, allow_nan=False) + "\n")
    except OSError as e:
        raise InferlabError(f"{path}: cannot write the result ({e.strerror})") from None


def not_finite_warning(result: EvalResult) -> str | None:
    """What to tell the user when a model's log-likelihoods came out NaN: its logits were not
    numbers somewhere (a broken checkpoint, say scales off by 1e30), which a `perplexity nan`
    line alone does not say. An infinite perplexity is a real, if hopeless, result."""
    broken = [name for name, ppl in ((result.model, result.ppl), (result.baseline, result.baseline_ppl))
              if ppl is not None and math.isnan(ppl)]
    if not broken:
        return None
    whose = "its" if len(broken) == 1 else "their"
    return (f"warning: {' and '.join(broken)} gave NaN log-probabilities: {whose} logits are not "
            f"all numbers (broken weights or scales?), so {whose} figures and any comparison "
            f"with {'it' if len(broken) == 1 else 'them'} mean nothing")


def render(result: EvalResult) -> str:
    """A few lines for the terminal."""
    windows = f"{result.windows} window{'s' if result.windows != 1 else ''}"
    lines = [f"{result.model} on {result.dataset}: {windows} of {result.seq_len} "
             f"tokens, {result.tokens:,} predicted tokens, {result.dtype}"
             f"{', via the engine' if result.via_engine else ''}, {result.elapsed_s:.1f} s",
             f"perplexity {result.ppl:.4f}  (mean NLL {result.nll:.5f})"]
    if result.baseline is not None:
        change = 100.0 * (result.ppl / result.baseline_ppl - 1.0)
        lines += [f"baseline {result.baseline}: perplexity {result.baseline_ppl:.4f} "
                  f"(model {change:+.2f}%)",
                  f"KL(baseline || model): mean {result.kl_mean:.6f}  median {result.kl_median:.6f}"
                  f"  p99 {result.kl_p99:.6f}  max {result.kl_max:.6f}",
                  f"top-1 agreement {100.0 * result.top1_agreement:.2f}%"]
    return "\n".join(lines)
