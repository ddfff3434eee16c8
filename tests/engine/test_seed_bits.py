"""Request seeds across their whole 64-bit range draw apart: torch's CPU generator keeps only a
seed's low 32 bits, so 7 and 2**32 + 7 (or -2 and 2**63 - 2) sampled the same tokens. (-1 is
no seed, as in vLLM.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from inferlab.engine.sampling_params import SamplingParams
from inferlab.engine.seeded_draws import SeededUniforms

CPU = torch.device("cpu")


def draws(seed: int) -> list[float]:
    request = SimpleNamespace(request_id="r", sampling_params=SamplingParams(temperature=1.0, seed=seed))
    return [float(d) for d in SeededUniforms().take(request, 3, CPU)]


def test_a_32_bit_seed_draws_what_torch_draws_for_it():
    for seed in (0, 7, 2**32 - 1):
        expected = torch.rand(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        assert draws(seed) == expected.tolist()


@pytest.mark.parametrize(("a", "b"), [(7, 2**32 + 7), (-2, 2**63 - 2), (0, 2**32), (2**32 - 2, -2),
                                      (2**40, 2**41)])
def test_seeds_that_differ_above_bit_31_draw_apart(a, b):
    assert draws(a) != draws(b)


def test_a_seed_is_its_64_bits():
    assert draws(-2) == draws(2**64 - 2) and draws(2**40) == draws(2**40)
