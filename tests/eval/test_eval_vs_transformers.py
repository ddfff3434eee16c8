"""Perplexity, KL and top-1 agreement equal what transformers' own forward gives on the same windows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from eval_helpers import reference_logits
from transformers import PreTrainedTokenizerFast

from inferlab.eval.config import EvalConfig
from inferlab.eval.perplexity import evaluate

SEQ_LEN = 32


def _reference_windows(model_dir, text_file) -> list[list[int]]:
    text = text_file.read_bytes().decode("utf-8").replace("\r\n", "\n")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == 500  # one token per character, no BOS
    return [ids[i:i + SEQ_LEN] for i in range(0, len(ids) - SEQ_LEN + 1, SEQ_LEN)]


def _config(model_dir, text_file, **kwargs) -> EvalConfig:
    return EvalConfig(model=str(model_dir), dataset=str(text_file), seq_len=SEQ_LEN,
                      dtype="float32", device="cpu", **kwargs)


def test_perplexity_matches_transformers_and_cross_entropy(char_models, char_text_file):
    (base_dir, base), _ = char_models
    windows = _reference_windows(base_dir, char_text_file)
    nll_sum = sum(F.cross_entropy(logits[:-1], torch.tensor(w[1:]), reduction="sum").item()
                  for w, logits in zip(windows, reference_logits(base, windows), strict=True))
    result = evaluate(_config(base_dir, char_text_file))
    assert (result.windows, result.tokens) == (15, 15 * 31)  # 500 // 32 windows of 31 predictions
    assert result.nll == pytest.approx(nll_sum / result.tokens, rel=1e-5)
    assert result.ppl == pytest.approx(math.exp(nll_sum / result.tokens), rel=1e-5)
    assert result.baseline is None and "kl_mean" not in result.to_dict()


def test_a_model_against_itself_has_zero_kl_and_full_agreement(char_models, char_text_file):
    (base_dir, _), _ = char_models
    result = evaluate(_config(base_dir, char_text_file, baseline=str(base_dir), limit=4))
    assert (result.windows, result.tokens) == (4, 4 * 31)
    assert result.kl_mean == 0.0 and result.kl_max == 0.0
    assert result.top1_agreement == 1.0
    assert result.ppl == result.baseline_ppl


def test_kl_against_a_perturbed_copy_matches_torch_kl_div(char_models, char_text_file):
    (base_dir, base), (other_dir, perturbed) = char_models
    windows = _reference_windows(base_dir, char_text_file)
    kl, same, base_nll = [], [], 0.0
    for w, p_logits, q_logits in zip(windows, reference_logits(base, windows),
                                     reference_logits(perturbed, windows), strict=True):
        log_p, log_q = F.log_softmax(p_logits[:-1], -1), F.log_softmax(q_logits[:-1], -1)
        # kl_div(input=log q, target=log p) = sum p (log p - log q) = KL(p || q)
        kl.append(F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1))
        same.append(p_logits[:-1].argmax(-1) == q_logits[:-1].argmax(-1))
        base_nll += F.cross_entropy(p_logits[:-1], torch.tensor(w[1:]), reduction="sum").item()
    kl_all, same_all = torch.cat(kl).double().numpy(), torch.cat(same)

    result = evaluate(_config(other_dir, char_text_file, baseline=str(base_dir)))
    assert result.kl_mean > 1e-3
    assert result.kl_mean == pytest.approx(kl_all.mean(), rel=1e-3)
    assert result.kl_p99 == pytest.approx(np.percentile(kl_all, 99), rel=1e-3)
    assert result.kl_max == pytest.approx(kl_all.max(), rel=1e-3)
    assert result.top1_agreement == pytest.approx(same_all.float().mean().item(), abs=1 / len(same_all))
    assert result.baseline_ppl == pytest.approx(math.exp(base_nll / result.tokens), rel=1e-5)
    assert result.ppl != pytest.approx(result.baseline_ppl, rel=1e-4)
