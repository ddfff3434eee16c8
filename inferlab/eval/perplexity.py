"""Perplexity the way the GPTQ and AWQ papers measure it, optionally against a baseline model.

The whole text is tokenized at once (a BOS token only if the model's tokenizer adds one, so
at most at the start of the first window), cut into non-overlapping windows of seq_len tokens
(the last partial one dropped), and every window is scored on its own: tokens 1..L-1 each
predicted from the ones before them. ppl = exp(mean NLL over all predicted tokens).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from inferlab.config import canonical_dtype
from inferlab.engine.platform import resolve_device, resolve_dtype
from inferlab.errors import InferlabError
from inferlab.eval.config import EvalConfig
from inferlab.eval.dataset import cut_windows, read_text
from inferlab.eval.metrics import WindowScores, compare_window, token_nll
from inferlab.eval.result import EvalResult, Tally, kl_summary
from inferlab.eval.window import WindowRunner, context_unit
from inferlab.models.loader import LoadedModel, load_model

ScoreFn = Callable[[Sequence[int]], WindowScores]


def run_windows(windows: Sequence[Sequence[int]], score: ScoreFn, desc: str = "eval") -> Tally:
    """Score window by window (only one window's logits alive at a time), with a progress bar."""
    tally = Tally()
    bar = tqdm(windows, desc=desc, unit="window", disable=None)  # None: off when not a terminal
    for window in bar:
        tally.add(score(window))
        bar.set_postfix(ppl=f"{tally.ppl:.4f}")
    return tally


@dataclass
class Setup:
    """The run's resolved pieces: what evaluate() needs once the models are loaded."""

    loaded: LoadedModel
    windows: list[list[int]]
    dtype: torch.dtype
    device: torch.device
    baseline: LoadedModel | None = None


def prepare(config: EvalConfig) -> Setup:
    """Read the text, load the model(s), tokenize, cut windows; every user error surfaces here."""
    text = read_text(config.dataset)  # before loading, so a wrong path fails fast
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    loaded = load_model(config.model, dtype, device)
    _check_fits(loaded, config)
    ids = loaded.tokenizer.encode(text)
    top = max(ids, default=-1)
    if top >= loaded.config.vocab_size:  # a tokenizer with tokens the model has no rows for
        raise InferlabError(f"{loaded.name}'s tokenizer gives token id {top}, past its "
                            f"{loaded.config.vocab_size} embedding rows")
    windows = cut_windows(ids, config.seq_len, config.limit)
    baseline = None
    if config.baseline is not None:
        baseline = load_model(config.baseline, dtype, device)
        _check_fits(baseline, config)
        _check_same_vocabulary(loaded, baseline)
    return Setup(loaded, windows, dtype, device, baseline)


def _check_fits(loaded: LoadedModel, config: EvalConfig) -> None:
    """Its positions, and its sliding window, which attention here does not slide (the model's
    max_context)."""
    room = loaded.config.max_context - (1 if config.via_engine else 0)
    if config.seq_len > room:
        extra = " (the engine needs one position for the token it samples)" if config.via_engine else ""
        raise InferlabError(f"--seq-len {config.seq_len} is longer than {loaded.name} can take: "
                            f"{room} {context_unit(loaded.config)}{extra}")


def _check_same_vocabulary(loaded: LoadedModel, baseline: LoadedModel) -> None:
    same = (loaded.config.vocab_size == baseline.config.vocab_size
            and loaded.tokenizer.backend.get_vocab() == baseline.tokenizer.backend.get_vocab())
    if not same:
        raise InferlabError(f"{baseline.name} and {loaded.name} have different vocabularies; "
                            "KL divergence needs the same tokens on both sides")


def window_scorer(setup: Setup, config: EvalConfig) -> ScoreFn:
    """The function that scores one window: direct forward, engine, or model against baseline."""
    if config.via_engine:
        from inferlab.eval.engine_path import EngineScorer

        engine = EngineScorer(setup.loaded, config.seq_len, setup.dtype, setup.device.type)
        return lambda ids: WindowScores(nll=engine.token_nll(ids))
    runner = WindowRunner(setup.loaded, config.seq_len, setup.dtype, setup.device)
    if setup.baseline is None:
        return lambda ids: WindowScores(nll=token_nll(runner.logits(ids), ids))
    base_runner = WindowRunner(setup.baseline, config.seq_len, setup.dtype, setup.device)
    return lambda ids: compare_window(base_runner.logits(ids), runner.logits(ids), ids)


def evaluate(config: EvalConfig) -> EvalResult:
    setup = prepare(config)
    score = window_scorer(setup, config)
    start = time.perf_counter()
    tally = run_windows(setup.windows, score, desc=setup.loaded.name)
    elapsed_s = time.perf_counter() - start
    result = EvalResult(
        model=setup.loaded.name, dataset=os.path.abspath(config.dataset), seq_len=config.seq_len,
        dtype=canonical_dtype(setup.dtype), via_engine=config.via_engine,
        windows=tally.windows, tokens=tally.tokens, nll=tally.nll_sum / tally.tokens,
        ppl=tally.ppl, elapsed_s=elapsed_s, model_path=os.path.abspath(setup.loaded.path))
    if setup.baseline is not None:
        result = dataclasses.replace(result, baseline=setup.baseline.name,
                                     baseline_path=os.path.abspath(setup.baseline.path),
                                     **kl_summary(tally))
    return result
