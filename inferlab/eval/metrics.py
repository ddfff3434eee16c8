"""Per-token scores of one window: NLL of the true next token, KL against a baseline, top-1 match."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_ROWS_PER_CHUNK = 256  # bounds KL's float64 [rows, vocab] temporaries (256 x 150k vocab: 300 MB)


@dataclass
class WindowScores:
    """Scores of the L-1 predicted tokens of one window; the baseline fields only with a baseline."""

    nll: torch.Tensor  # float64 [L-1], -log p_model(token i+1 | tokens <= i)
    baseline_nll: torch.Tensor | None = None  # float64 [L-1], the same under the baseline
    kl: torch.Tensor | None = None  # float64 [L-1], KL(p_baseline || p_model) at each position
    top1_same: torch.Tensor | None = None  # bool [L-1], both models' most likely token agree


def token_nll(logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """logits [L, V], ids [L] -> NLL of tokens 1..L-1 given the ones before, float64 [L-1]."""
    targets = torch.as_tensor(list(ids[1:]), dtype=torch.long, device=logits.device)  # [L-1]
    nll = F.cross_entropy(logits[:-1].float(), targets, reduction="none")  # [L-1]
    return nll.double().cpu()


def kl_divergence(baseline_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row over the full vocabulary, p = softmax(baseline), q = softmax(logits).

    [M, V], [M, V] -> float64 [M]. In float64, over row chunks: a small KL (1e-4 for a good
    8-bit model) is a sum of 1e5 terms each carrying fp32 rounding of ~1e-6 otherwise.
    Identical inputs give exactly 0.
    """
    out = []
    for base, other in zip(baseline_logits.split(_ROWS_PER_CHUNK),
                           logits.split(_ROWS_PER_CHUNK), strict=True):
        log_p = torch.log_softmax(base.double(), dim=-1)  # [m, V]
        log_q = torch.log_softmax(other.double(), dim=-1)  # [m, V]
        # a token the baseline rules out (-inf) adds 0, not 0 * (-inf - log q) = NaN
        terms = torch.where(log_p == -math.inf, 0.0, log_p.exp() * (log_p - log_q))  # [m, V]
        out.append(terms.sum(dim=-1))  # [m]
    return torch.cat(out).cpu()


def compare_window(baseline_logits: torch.Tensor, logits: torch.Tensor,
                   ids: Sequence[int]) -> WindowScores:
    """Both models' logits [L, V] on the same window -> scores of its L-1 predicted tokens."""
    if baseline_logits.shape != logits.shape:
        raise ValueError(f"logits shapes differ: baseline {tuple(baseline_logits.shape)}, "
                         f"model {tuple(logits.shape)}")
    predicting_base, predicting = baseline_logits[:-1], logits[:-1]  # [L-1, V]: rows with a target
    same = (predicting_base.argmax(dim=-1) == predicting.argmax(dim=-1)).cpu()  # [L-1]
    return WindowScores(nll=token_nll(logits, ids), baseline_nll=token_nll(baseline_logits, ids),
                        kl=kl_divergence(predicting_base, predicting), top1_same=same)
