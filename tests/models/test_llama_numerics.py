"""Our flat, paged forward pass equals transformers, however the tokens are scheduled."""

from __future__ import annotations

import random

import pytest
import torch

from inferlab.models.loader import load_network

from .paged_harness import run_schedule
from .tiny_models import ARCHITECTURES, make_tiny_model

LENGTHS = [11, 5, 17, 1]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def pair(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    reference = make_tiny_model(request.param, directory)
    ours, _ = load_network(str(directory), torch.float32)
    rng = random.Random(1)
    seqs = [[rng.randrange(160) for _ in range(n)] for n in LENGTHS]
    with torch.no_grad():
        expected = [reference(torch.tensor([s])).logits[0] for s in seqs]
    return ours, seqs, expected


def _check(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape
        assert (g - e).abs().max().item() < 1e-4


def test_one_flat_prefill(pair):
    model, seqs, expected = pair
    _check(run_schedule(model, seqs, [[(i, len(s)) for i, s in enumerate(seqs)]]), expected)


def test_chunked_prefill_of_varying_sizes(pair):
    model, seqs, expected = pair
    rng = random.Random(2)
    remaining = [len(s) for s in seqs]
    steps = []
    while any(remaining):
        step = []
        for i, left in enumerate(remaining):
            if left:
                n = min(left, rng.choice([1, 2, 3, 5, 7]))
                step.append((i, n))
                remaining[i] -= n
        rng.shuffle(step)  # batch order need not follow sequence order
        steps.append(step)
    _check(run_schedule(model, seqs, steps, seed=3), expected)


def test_token_by_token_decode(pair):
    model, seqs, expected = pair
    prefill = [[(i, 1) for i in range(len(seqs))]]
    decode = [[(i, 1) for i, s in enumerate(seqs) if len(s) > t] for t in range(1, max(LENGTHS))]
    _check(run_schedule(model, seqs, prefill + decode, seed=4), expected)


def test_bf16_stays_close_to_fp32(pair):
    model, seqs, expected = pair
    bf16 = model.to(torch.bfloat16)
    try:
        got = run_schedule(bf16, seqs, [[(i, len(s)) for i, s in enumerate(seqs)]])
    finally:
        model.to(torch.float32)
    for g, e in zip(got, expected, strict=True):
        assert (g - e).abs().max().item() < 0.1 * e.abs().max().item()
