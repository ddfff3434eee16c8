"""2:4 semi-structured sparsity: in every aligned group of four inputs, two weights are zero."""

from __future__ import annotations

import torch

from inferlab.errors import InferlabError


def magnitude_2of4_mask(w: torch.Tensor) -> torch.Tensor:
    """Keep-mask [N, K] (True = kept): the two largest |w| of each group of four columns."""
    n, k = w.shape
    if k % 4:
        raise InferlabError(f"2:4 sparsity needs the input size to be a multiple of 4, got {k}")
    groups = w.abs().reshape(n, k // 4, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool)
    keep.scatter_(2, groups.topk(2, dim=2).indices, True)
    return keep.view(n, k)


def is_2of4(mask: torch.Tensor) -> bool:
    """Whether a keep-mask [N, K] keeps exactly two of every aligned four."""
    n, k = mask.shape
    return k % 4 == 0 and bool((mask.reshape(n, k // 4, 4).sum(dim=2) == 2).all())
