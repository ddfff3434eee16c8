"""GPTQ and SparseGPT: one Optimal Brain Surgeon column loop, quantizing and/or pruning.

Both walk the input columns of W [N, K] in order. Column i is rounded (GPTQ) or masked to 2 of 4
(SparseGPT) and the error it leaves, divided by the i-th diagonal of U = chol(H^-1)^T, is pushed
onto the columns not yet processed: W[:, j] -= err * U[i, j]. H = 2 X^T X / T is the layer's
input Hessian; it is damped by `damp` x its mean diagonal before inversion. Columns go in blocks
of `block_size`, the error inside a block applied column by column and to the rest of W at once
(the lazy batch update of the GPTQ paper). Rows are independent, so a fused layer (q|k|v) gives
the same result as its shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from inferlab.errors import InferlabError
from inferlab.quant.qparams import (
    QuantizedWeight,
    compute_qparams,
    fake_quantize,
    num_groups,
    quantize,
)
from inferlab.quant.scheme import GROUP, WeightArgs


@dataclass(frozen=True)
class ObsConfig:
    block_size: int = 128
    damp: float = 0.01  # fraction of the mean Hessian diagonal added to it
    act_order: bool = False  # process columns by decreasing Hessian diagonal (GPTQ)
    prune_2of4: bool = False  # SparseGPT's 2:4 mask, chosen per 4 columns as they are reached

    def __post_init__(self) -> None:
        # GPTQ's lazy batch update is exact for any block; SparseGPT's 2:4 groups start at
        # multiples of 4 within a block, so a block must hold whole groups
        if self.block_size <= 0 or (self.prune_2of4 and self.block_size % 4):
            need = "a positive multiple of 4 for 2:4 pruning" if self.prune_2of4 else "positive"
            raise InferlabError(f"--block-size must be {need}, got {self.block_size}")
        if not 0 <= self.damp < 1:
            raise InferlabError(f"--dampening must be in [0, 1), got {self.damp}")
        if self.act_order and self.prune_2of4:
            raise InferlabError("act-order reorders columns and would break 2:4 groups; use one")


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp*mean(diag) I)^-1 [K, K]."""
    h = h.clone()
    h.diagonal().add_(damp * h.diagonal().mean())
    try:
        lower = torch.linalg.cholesky(h)
    except torch.linalg.LinAlgError:  # numerically indefinite: damp harder once
        h.diagonal().add_(0.1 * h.diagonal().mean())
        lower = torch.linalg.cholesky(h)
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)


def obs_compress(weight: torch.Tensor, hessian: torch.Tensor, args: WeightArgs | None,
                 cfg: ObsConfig, scale_dtype: torch.dtype = torch.float32
                 ) -> tuple[torch.Tensor, QuantizedWeight | None, torch.Tensor | None]:
    """weight [N, K] fp32, hessian [K, K] -> (new weight [N, K], codes or None, 2:4 keep-mask or None).

    With `args` the returned weight is exactly what the codes dequantize to; with `prune_2of4`
    the mask [N, K] (True = kept) has two Trues in every aligned group of four columns.
    """
    w = weight.detach().float().clone()
    n, k = w.shape
    groups = num_groups(k, args) if args is not None else 1
    h = hessian.float().clone()
    dead = h.diagonal() == 0  # inputs that were always zero carry no information
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    perm = torch.argsort(h.diagonal(), descending=True) if cfg.act_order else torch.arange(k)
    w, h = w[:, perm], h[perm][:, perm]
    u = _inverse_cholesky(h, cfg.damp)
    group_of = (perm // (k // groups)) if args is not None else None  # group of each processed column
    scale, zero = _initial_qparams(weight, args, cfg, groups, scale_dtype)
    out = torch.zeros_like(w)
    keep = torch.ones(n, k, dtype=torch.bool) if cfg.prune_2of4 else None
    with _one_thread():
        _column_loop(w, u, out, keep, args, cfg, scale, zero, group_of, groups, scale_dtype)
    inverse = torch.argsort(perm)
    out = out[:, inverse]
    keep = keep[:, inverse] if keep is not None else None
    if args is None:
        return out, None, keep
    s = scale.to(scale_dtype)
    zp = None if args.symmetric else zero.to(torch.int8)
    return out, QuantizedWeight(quantize(out, s, zp, args), s, zp, args), keep



@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The column loop is thousands of small ops: threads only add synchronisation (measured 10x
    slower with 2 threads on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _column_loop(w: torch.Tensor, u: torch.Tensor, out: torch.Tensor, keep: torch.Tensor | None,
                 args: WeightArgs | None, cfg: ObsConfig, scale: torch.Tensor | None,
                 zero: torch.Tensor | None, group_of: torch.Tensor | None, groups: int,
                 scale_dtype: torch.dtype) -> None:
    """Fill `out` (and `keep`) column by column, in processed order; updates w, scale, zero."""
    k = w.shape[1]
    lazy_groups = args is not None and args.strategy == GROUP and not cfg.act_order
    for i1 in range(0, k, cfg.block_size):
        i2 = min(i1 + cfg.block_size, k)
        w1, u1 = w[:, i1:i2].clone(), u[i1:i2, i1:i2]
        err1 = torch.zeros_like(w1)
        for i in range(i2 - i1):
            col = i1 + i
            if keep is not None and i % 4 == 0:  # mask the 2 of 4 with the least OBS saliency
                saliency = w1[:, i:i + 4] ** 2 / u1.diagonal()[i:i + 4] ** 2  # [N, 4]
                drop = torch.topk(saliency, 2, dim=1, largest=False).indices
                keep[:, col:col + 4].scatter_(1, drop, False)
            q = w1[:, i] if keep is None else w1[:, i] * keep[:, col]
            if args is not None:
                g = int(group_of[col])
                if lazy_groups and col % (k // groups) == 0:  # scales from the current weights
                    s, z = compute_qparams(_group_weights(w, w1, i1, i, k // groups), args,
                                           scale_dtype, groups=1)
                    scale[:, g], zero[:, g] = s[:, 0].float(), (z[:, 0] if z is not None else 0)
                q = fake_quantize(q[:, None], scale[:, g:g + 1], _zp(zero, args, g), args)[:, 0]
            out[:, col] = q
            err = (w1[:, i] - q) / u1[i, i]  # [N]
            w1[:, i:] -= err[:, None] * u1[i, i:][None, :]
            err1[:, i] = err
        w[:, i2:] -= err1 @ u[i1:i2, i2:]


def _group_weights(w: torch.Tensor, w1: torch.Tensor, i1: int, i: int, size: int) -> torch.Tensor:
    """The current (error-updated) weights of the `size` columns starting at block column i
    [N, size]: the in-block ones from w1, any past the block from w. Without act-order only,
    where processed order is the original order."""
    inside = w1[:, i:i + size]
    if inside.shape[1] == size:
        return inside
    start = i1 + w1.shape[1]
    return torch.cat([inside, w[:, start:start + size - inside.shape[1]]], dim=1)


def _zp(zero: torch.Tensor | None, args: WeightArgs, g: int) -> torch.Tensor | None:
    return None if args.symmetric else zero[:, g:g + 1]


def _initial_qparams(weight: torch.Tensor, args: WeightArgs | None, cfg: ObsConfig, groups: int,
                     scale_dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Scales known before the loop: per channel, or per group under act-order (static groups,
    from the original weight). Otherwise NaN, filled when the loop reaches each group."""
    if args is None:
        return None, None
    n = weight.shape[0]
    if args.strategy != GROUP or cfg.act_order:
        s, z = compute_qparams(weight.float(), args, scale_dtype)
        zero = z.float() if z is not None else torch.zeros(n, s.shape[1])
        return s.float(), zero
    return torch.full((n, groups), float("nan")), torch.zeros(n, groups)
