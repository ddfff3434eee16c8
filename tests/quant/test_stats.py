"""AWQ's calibration sample (InputStats): bounded over any number of batches, and uniform."""

from __future__ import annotations

import torch

from inferlab.quant.algorithms.stats import InputStats


def labelled_batches(sizes: list[int], width: int = 3) -> list[torch.Tensor]:
    """Batches whose rows are [i, i, ...] for the row's global index i, so a row names itself."""
    batches, start = [], 0
    for n in sizes:
        batches.append(torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, width))
        start += n
    return batches


def test_held_sample_stays_at_the_cap_over_many_batches() -> None:
    stats = InputStats(3, hessian=False, sample_rows=16)
    for batch in labelled_batches([7] * 50):  # 350 rows
        stats.add(batch)
        assert stats.held_rows <= 16
    rows = stats.samples()
    labels = rows[:, 0]
    assert rows.shape == (16, 3) and stats.held_rows == 16
    assert torch.equal(rows, labels[:, None].repeat(1, 3))  # whole input rows, not mixtures
    assert torch.equal(labels, labels.unique())  # distinct, in arrival order
    assert labels.max() >= 175  # not just the first batches kept
    assert torch.equal(stats.samples(), rows)  # the same rows every call


def test_rows_under_the_cap_are_all_kept_in_order() -> None:
    """Hand-checkable: 5 + 4 + 6 rows fit under a cap of 16, so the sample is every row (the
    rows the old keep-everything-then-thin code kept too), in the order they came."""
    stats = InputStats(3, hessian=False, sample_rows=16)
    batches = labelled_batches([5, 4, 6])
    for batch in batches:
        stats.add(batch)
    assert torch.equal(stats.samples(), torch.cat(batches))
    assert InputStats(3, hessian=False, sample_rows=0).samples().shape == (0, 3)


def test_sample_is_uniform_over_rows_of_all_batches() -> None:
    """Every row is kept with probability cap / rows, whatever its batch: over 400 seeds the
    batches of 4, 12 and 48 rows keep 8 * (4, 12, 48) / 64 = 0.5, 1.5 and 6 rows on average.
    (Capping each batch at 8 rows, then thinning the 20 evenly, the old rule, kept 2, 3 and 3.)"""
    sizes, seeds = [4, 12, 48], 400
    kept = torch.zeros(3)
    for seed in range(seeds):
        stats = InputStats(3, hessian=False, sample_rows=8, seed=seed)
        for batch in labelled_batches(sizes):
            stats.add(batch)
        labels = stats.samples()[:, 0]
        kept += torch.tensor([((labels >= 0) & (labels < 4)).sum(),
                              ((labels >= 4) & (labels < 16)).sum(), (labels >= 16).sum()])
    expected = torch.tensor([0.5, 1.5, 6.0])
    # a batch's count is hypergeometric (variance <= 1.33): sd of the 400-seed mean <= 0.06
    assert (kept / seeds - expected).abs().max() < 0.25
