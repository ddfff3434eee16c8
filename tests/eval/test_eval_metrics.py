"""NLL, KL and their summaries on cases small enough to work out by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

from inferlab.eval.metrics import WindowScores, compare_window, kl_divergence, token_nll
from inferlab.eval.perplexity import run_windows
from inferlab.eval.result import EvalResult, Tally, kl_summary, write_json


def test_token_nll_scores_tokens_one_to_last_from_the_row_before():
    logits = torch.tensor([[0.0, math.log(3.0)],  # p(token 1) = 3/4
                           [0.0, 0.0],  # uniform: 1/2 each
                           [5.0, -5.0]])  # last row predicts nothing in the window
    nll = token_nll(logits, [0, 1, 0])
    assert nll.dtype == torch.float64
    assert nll.tolist() == pytest.approx([math.log(4 / 3), math.log(2)], rel=1e-6)


def test_uniform_logits_give_perplexity_equal_to_the_vocabulary_size():
    windows = [[1, 2, 3, 4, 5], [6, 0, 6, 0, 6], [2, 2, 2, 2, 2]]
    tally = run_windows(windows, lambda ids: WindowScores(nll=token_nll(torch.zeros(len(ids), 7), ids)))
    assert (tally.windows, tally.tokens) == (3, 12)
    assert tally.ppl == pytest.approx(7.0, rel=1e-6)


def test_kl_divergence_by_hand_and_its_direction():
    p_logits = torch.tensor([[0.0, 0.0]], dtype=torch.float64)  # p = (1/2, 1/2)
    q_logits = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)  # q = (3/4, 1/4)
    # KL(p||q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3); KL(q||p) = 3/4 ln(3/2) + 1/4 ln(1/2)
    assert kl_divergence(p_logits, q_logits).item() == pytest.approx(0.5 * math.log(4 / 3), rel=1e-9)
    assert kl_divergence(q_logits, p_logits).item() == pytest.approx(
        0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-9)
    assert kl_divergence(q_logits, q_logits + 7.0).item() == pytest.approx(0.0, abs=1e-12)  # shift


def test_kl_divergence_where_the_baseline_rules_a_token_out():
    """p = (1/2, 1/2, 0) by a -inf logit: that token adds 0 to KL (it once made the sum NaN);
    q ruling out a token p allows gives an infinite KL."""
    inf = math.inf
    p_logits = torch.tensor([[0.0, 0.0, -inf]], dtype=torch.float64)
    q_logits = torch.tensor([[math.log(3.0), 0.0, 0.0]], dtype=torch.float64)  # q = (3/5, 1/5, 1/5)
    # KL(p||q) = 1/2 ln((1/2)/(3/5)) + 1/2 ln((1/2)/(1/5)) = 1/2 ln(25/12)
    assert kl_divergence(p_logits, q_logits).item() == pytest.approx(0.5 * math.log(25 / 12), rel=1e-9)
    assert kl_divergence(p_logits, p_logits).item() == 0.0
    assert kl_divergence(q_logits, p_logits).item() == inf


def test_compare_window_counts_top1_agreement_on_predicting_rows_only():
    base = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [9.0, 0.0, 0.0]])
    model = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 2.0], [0.0, 9.0, 0.0]])
    scores = compare_window(base, model, [0, 1, 2, 0])
    assert scores.top1_same.tolist() == [True, False, True]  # the last row has no target
    assert scores.kl.shape == (3,) and scores.kl[2].item() == 0.0 and scores.kl[1].item() > 0


def test_kl_summary_percentiles_and_agreement_by_hand():
    tally = Tally()
    values = torch.arange(101, dtype=torch.float64)  # per-token KL 0, 1, ..., 100
    for part in values.split([60, 41]):
        n = part.numel()
        tally.add(WindowScores(nll=torch.full((n,), 1.0, dtype=torch.float64),
                               baseline_nll=torch.full((n,), 0.5, dtype=torch.float64),
                               kl=part, top1_same=torch.arange(n) % 4 != 0))
    summary = kl_summary(tally)
    assert summary["kl_mean"] == pytest.approx(50.0)
    assert summary["kl_median"] == pytest.approx(50.0)
    assert summary["kl_p99"] == pytest.approx(99.0)  # rank 0.99 * 100 = 99 exactly
    assert summary["kl_max"] == 100.0
    assert summary["baseline_ppl"] == pytest.approx(math.exp(0.5))
    # not agreeing: positions 0,4,..,56 of the first part (15) and 0,4,..,40 of the second (11)
    assert summary["top1_agreement"] == pytest.approx((101 - 26) / 101)


def test_a_broken_models_figures_are_inf_and_null_in_the_json(tmp_path):
    """A mean NLL of 2459.6 (a norm weight x1000) is past exp's range: perplexity inf, not an
    OverflowError that lost the run; NaN and inf figures go to the JSON file as null."""
    tally = Tally()
    n = 4
    tally.add(WindowScores(nll=torch.full((n,), 2459.6, dtype=torch.float64),
                           baseline_nll=torch.full((n,), 3.0, dtype=torch.float64),
                           kl=torch.full((n,), float("nan"), dtype=torch.float64),
                           top1_same=torch.zeros(n, dtype=torch.bool)))
    assert tally.ppl == math.inf
    result = EvalResult(model="broken", dataset="d", seq_len=5, dtype="float32", via_engine=False,
                        windows=1, tokens=n, nll=2459.6, ppl=tally.ppl, elapsed_s=1.0,
                        baseline="embedded", **kl_summary(tally))
    write_json(result, str(tmp_path / "out.json"))

    def strict(constant: str):
        raise ValueError(f"not JSON: {constant}")

    written = json.loads((tmp_path / "out.json").read_text(), parse_constant=strict)
    assert written["ppl"] is None and written["kl_mean"] is None and written["nll"] == 2459.6
    assert written["baseline_ppl"] == pytest.approx(math.exp(3.0))
