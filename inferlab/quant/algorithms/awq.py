"""AWQ: activation-aware per-input-channel scales, searched on a grid, then (optionally) clipping.

Channels whose inputs are large matter more; multiplying weight column k by s_k (and dividing
the op that produces input k by s_k, so the float function is unchanged) gives those columns
finer quantization steps. s = mean|x|^a / mean|w~|^(1-a) (w~: weights normalised per group),
normalised to geometric mean 1, for a in {0, 1/grid, ..., (grid-1)/grid}; the a whose
fake-quantized block output is closest (MSE) to the float output on calibration rows wins.
a = 0 with duo scaling still rescales; the grid always includes s = 1 (plain RTN) so the chosen
scale never does worse than RTN on the calibration rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inferlab.errors import InferlabError
from inferlab.quant.qparams import compute_qparams, fake_quantize, num_groups
from inferlab.quant.scheme import WeightArgs

Block = Callable[[list[torch.Tensor]], torch.Tensor]  # weights -> block output on fixed inputs


@dataclass(frozen=True)
class AwqConfig:
    grid: int = 20  # scale exponents tried
    duo_scaling: bool = True  # divide by the weight magnitude too (AutoAWQ's default)
    clip: bool = False  # search a per-group clipping ratio after scaling
    clip_grid: int = 20
    max_shrink: float = 0.5  # smallest clipping ratio tried
    sample_rows: int = 2048  # calibration rows kept per layer for the searches

    def __post_init__(self) -> None:
        if self.grid < 1 or self.clip_grid < 1:
            raise InferlabError("AWQ grids need at least one point")
        if not 0 < self.max_shrink < 1:
            raise InferlabError(f"AWQ max shrink must be in (0, 1), got {self.max_shrink}")


def weight_importance(weights: list[torch.Tensor], args: WeightArgs) -> torch.Tensor:
    """Mean over output rows of |w| normalised by its group's max: [K]."""
    w = torch.cat(weights).float()
    groups = num_groups(w.shape[1], args)
    wg = w.abs().view(w.shape[0], groups, -1)
    wg = wg / wg.amax(dim=-1, keepdim=True).clamp(min=1e-12)
    return wg.view_as(w).mean(dim=0)


def fake_quantize_rtn(w: torch.Tensor, args: WeightArgs) -> torch.Tensor:
    scale, zero = compute_qparams(w, args)
    return fake_quantize(w, scale, zero, args)


def candidate_scales(x_mean: torch.Tensor, w_mean: torch.Tensor, ratio: float,
                     duo: bool) -> torch.Tensor:
    s = x_mean.pow(ratio)
    if duo:
        s = s / w_mean.clamp(min=1e-4).pow(1 - ratio)
    s = s.clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def search_scales(x: torch.Tensor, weights: list[torch.Tensor], args: WeightArgs, block: Block,
                  cfg: AwqConfig) -> tuple[torch.Tensor, dict[float, float]]:
    """x [T, K] inputs shared by `weights` [N_i, K] -> (best scales [K], loss per ratio).

    `block(ws)` must return the block output computed with weights `ws` on the same rows.
    Ratio -1 stands for s = 1 (no scaling).
    """
    x_mean = x.abs().mean(dim=0).float()
    w_mean = weight_importance(weights, args)
    with torch.no_grad():
        reference = block(weights)
        losses: dict[float, float] = {}
        best_scale, best_loss = torch.ones_like(x_mean), float("inf")
        candidates = [(-1.0, torch.ones_like(x_mean))]
        candidates += [(r / cfg.grid, None) for r in range(cfg.grid)]
        for ratio, s in candidates:
            s = s if s is not None else candidate_scales(x_mean, w_mean, ratio, cfg.duo_scaling)
            trial = [fake_quantize_rtn(w.float() * s, args) / s for w in weights]
            loss = (block(trial) - reference).pow(2).mean().item()
            losses[ratio] = loss
            if loss < best_loss:
                best_loss, best_scale = loss, s
    return best_scale, losses


def search_clip(x: torch.Tensor, w: torch.Tensor, args: WeightArgs, cfg: AwqConfig,
                rows: torch.Tensor | None = None) -> torch.Tensor:
    """Per (row, group) clipping ratio [N, G] minimising that group's share of the output error.

    The error of group g in row n over the rows x_t is mean_t (x_t,g . d_n,g)^2 = d C_g d^T with
    C_g = X_g^T X_g / T, so one [G, g, g] covariance replaces the rows (T-independent cost).
    Only `rows` (a bool mask [N]) are searched; the others keep ratio 1 (AWQ leaves q and k
    unclipped: their error is amplified through the attention softmax).
    """
    n, k = w.shape
    groups = num_groups(k, args)
    xg = x.float().view(x.shape[0], groups, k // groups)  # [T, G, g]
    cov = torch.einsum("tgk,tgl->gkl", xg, xg) / max(x.shape[0], 1)  # [G, g, g]
    w = w.float()
    best = torch.ones(n, groups)
    best_err = torch.full((n, groups), float("inf"))
    for i in range(cfg.clip_grid):
        ratio = 1 - cfg.max_shrink * i / cfg.clip_grid
        scale, zero = compute_qparams(w, args, clip=ratio)
        diff = (w - fake_quantize(w, scale, zero, args)).view(n, groups, -1)  # [N, G, g]
        err = (torch.einsum("ngk,gkl->ngl", diff, cov) * diff).sum(dim=-1)  # [N, G]
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best[better] = ratio
    if rows is not None:
        best[~rows] = 1.0
    return best
