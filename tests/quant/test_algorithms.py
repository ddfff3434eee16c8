"""Each algorithm on a small layer, against a property that can be checked by hand."""

from __future__ import annotations

import pytest
import torch

from inferlab.models.layers import RMSNorm
from inferlab.quant.algorithms.awq import AwqConfig, search_clip, search_scales
from inferlab.quant.algorithms.fold import fold_scales
from inferlab.quant.algorithms.obs import ObsConfig, obs_compress
from inferlab.quant.algorithms.smoothquant import smoothing_scales
from inferlab.quant.algorithms.sparsity import is_2of4, magnitude_2of4_mask
from inferlab.quant.qparams import compute_qparams, fake_quantize, quantize_rtn
from inferlab.quant.scheme import make_scheme

W4 = make_scheme("W4A16", 32).weights
W4_ASYM = make_scheme("W4A16", 32, asymmetric=True).weights
W8 = make_scheme("W8A8").weights


def correlated_inputs(tokens: int, k: int, seed: int) -> torch.Tensor:
    """Inputs living near a 12-dimensional subspace, as hidden states do."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.randn(12, k, generator=torch.Generator().manual_seed(99))
    return torch.randn(tokens, 12, generator=gen) @ basis + 0.05 * torch.randn(tokens, k, generator=gen)


def outlier_inputs(tokens: int, k: int, seed: int) -> torch.Tensor:
    """A few channels 30x larger than the rest, as in LLM activations."""
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(seed))
    x[:, [3, 17, 40]] *= 30.0
    return x


def output_error(x: torch.Tensor, w: torch.Tensor, w_hat: torch.Tensor) -> float:
    return (x @ w.T - x @ w_hat.T).pow(2).mean().item()


def hessian(x: torch.Tensor) -> torch.Tensor:
    return 2 * x.T @ x / x.shape[0]


@pytest.mark.parametrize("args", [W4, W4_ASYM, W8], ids=["int4-g32", "int4-g32-asym", "int8-channel"])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn_on_correlated_inputs(args, act_order: bool) -> None:
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(0))
    calib, held_out = correlated_inputs(1024, 128, 1), correlated_inputs(512, 128, 2)
    new_w, qw, _ = obs_compress(w, hessian(calib), args, ObsConfig(block_size=32, act_order=act_order))
    assert torch.equal(qw.dequantize(), new_w)  # the returned weight is what the codes encode
    rtn = quantize_rtn(w, args).dequantize()
    assert output_error(held_out, w, new_w) < 0.5 * output_error(held_out, w, rtn)


@pytest.mark.parametrize("args", [W4, W8], ids=["int4-g32", "int8-channel"])
def test_gptq_is_rtn_when_inputs_are_uncorrelated(args) -> None:
    # H proportional to I: no column's error can be compensated by another, so nothing moves
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(3))
    new_w, _, _ = obs_compress(w, 2 * torch.eye(64), args, ObsConfig(block_size=16))
    torch.testing.assert_close(new_w, quantize_rtn(w, args).dequantize(), rtol=0, atol=1e-6)


def test_awq_scale_improves_block_output_error() -> None:
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(4))
    calib, held_out = outlier_inputs(512, 96, 5), outlier_inputs(512, 96, 6)
    scale, losses = search_scales(calib, [w], W4, lambda ws: calib @ ws[0].T, AwqConfig())
    assert min(losses.values()) < losses[-1.0]  # some scale beats no scale (RTN)
    awq_w = fake_quantize(*_scaled_rtn(w, scale), W4) / scale
    rtn_w = quantize_rtn(w, W4).dequantize()
    assert output_error(held_out, w, awq_w) < 0.8 * output_error(held_out, w, rtn_w)


def _scaled_rtn(w: torch.Tensor, scale: torch.Tensor):
    ws = w * scale
    s, z = compute_qparams(ws, W4)
    return ws, s, z


def test_awq_clip_search_never_hurts_the_group_error() -> None:
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))
    w[:, 5] *= 8  # an outlier weight in each row's first group makes clipping worthwhile
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(8))
    clip = search_clip(x, w, W4, AwqConfig())
    assert clip.shape == (32, 2) and ((clip > 0.49) & (clip <= 1)).all()
    s, z = compute_qparams(w, W4, clip=clip)
    assert output_error(x, w, fake_quantize(w, s, z, W4)) <= output_error(x, w, quantize_rtn(w, W4).dequantize())


def test_smoothquant_transform_leaves_the_float_output_unchanged() -> None:
    gen = torch.Generator().manual_seed(9)
    norm = RMSNorm(96, 1e-5)
    norm.weight.data = torch.rand(96, generator=gen) + 0.5
    linear = torch.nn.Linear(96, 40, bias=False)
    x = outlier_inputs(64, 96, 10)
    before = linear(norm(x))
    act_max = norm(x).abs().amax(dim=0)
    scale = smoothing_scales(act_max, [linear.weight.data], alpha=0.5)
    fold_scales(scale, norm.weight.data, [linear.weight.data])
    torch.testing.assert_close(linear(norm(x)), before, rtol=1e-5, atol=1e-5)
    after_max = norm(x).abs().amax(dim=0)  # the outlier channels were flattened
    assert after_max.max() / after_max.median() < 0.5 * (act_max.max() / act_max.median())


def test_magnitude_mask_keeps_the_two_largest_of_four() -> None:
    w = torch.tensor([[0.1, -4.0, 3.0, 0.2, 1.0, 2.0, -3.0, 0.0]])
    assert magnitude_2of4_mask(w).tolist() == [[False, True, True, False, False, True, True, False]]


@pytest.mark.parametrize("args", [None, W4], ids=["sparse", "sparse+int4"])
def test_sparsegpt_masks_two_of_four_and_beats_magnitude(args) -> None:
    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(11))
    calib, held_out = correlated_inputs(1024, 128, 12), correlated_inputs(512, 128, 13)
    new_w, qw, keep = obs_compress(w, hessian(calib), args, ObsConfig(block_size=32, prune_2of4=True))
    assert is_2of4(keep)
    assert (new_w.view(48, 32, 4) == 0).sum(dim=2).min() >= 2  # pruned weights are exactly zero
    assert torch.equal(new_w[~keep], torch.zeros(int((~keep).sum())))
    magnitude = w * magnitude_2of4_mask(w)
    assert output_error(held_out, w, new_w) < 0.7 * output_error(held_out, w, magnitude)
    if qw is not None:
        assert torch.equal(qw.dequantize(), new_w)


def test_rescaled_input_statistics_equal_statistics_of_rescaled_inputs() -> None:
    from inferlab.quant.algorithms.stats import InputStats

    x = outlier_inputs(256, 48, 14)
    s = torch.rand(48, generator=torch.Generator().manual_seed(15)) + 0.5
    folded, direct = InputStats(48, True, 64), InputStats(48, True, 64)
    folded.add(x)
    folded.scale_inputs(s)  # statistics of x, then told the inputs became x / s
    direct.add(x / s)
    torch.testing.assert_close(folded.hessian(), direct.hessian(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(folded.abs_max, direct.abs_max)
    torch.testing.assert_close(folded.samples(), direct.samples())
