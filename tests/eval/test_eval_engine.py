"""On the embedded model, perplexity through the serving engine equals the direct forward's."""

from __future__ import annotations

import pytest
import torch

from inferlab.eval.config import EvalConfig
from inferlab.eval.dataset import cut_windows, read_text
from inferlab.eval.perplexity import Setup, run_windows, window_scorer

SEQ_LEN = 128


def test_engine_and_direct_perplexity_agree_on_wikitext(smollm_fp32, shared_file):
    text = read_text(str(shared_file("wikitext-2-raw/wiki.test.raw")))
    windows = cut_windows(smollm_fp32.tokenizer.encode(text[:3000]), SEQ_LEN, limit=2)
    setup = Setup(smollm_fp32, windows, torch.float32, torch.device("cpu"))
    ppl = {}
    for via_engine in (False, True):
        config = EvalConfig(seq_len=SEQ_LEN, dtype="float32", device="cpu", via_engine=via_engine)
        tally = run_windows(windows, window_scorer(setup, config))
        assert (tally.windows, tally.tokens) == (2, 2 * (SEQ_LEN - 1))
        ppl[via_engine] = tally.ppl
    assert 5 < ppl[False] < 200  # a trained model on English, not noise
    assert ppl[True] == pytest.approx(ppl[False], abs=0.01)
