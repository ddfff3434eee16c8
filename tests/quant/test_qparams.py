"""Scales, zero points and codes on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from inferlab.errors import InferlabError
from inferlab.kernels.scaled_mm import FP8_MAX, INT8_MAX
from inferlab.quant.algorithms.stats import InputStats
from inferlab.quant.layer import static_input_scale
from inferlab.quant.qparams import compute_qparams, quantize_rtn
from inferlab.quant.scheme import (
    FLOAT,
    INT,
    ActivationArgs,
    QuantScheme,
    WeightArgs,
    make_scheme,
    scheme_from_ct_group,
)

INT4_SYM = WeightArgs(4, "int", "group", 4, True)
INT4_ASYM = WeightArgs(4, "int", "group", 4, False)


def test_symmetric_int4_by_hand() -> None:
    # absmax 1.4 -> scale 1.4 / 7 = 0.2; 0.7/0.2 = 3.5 rounds to even 4; 0.35/0.2 = 1.75 -> 2
    qw = quantize_rtn(torch.tensor([[0.7, -1.4, 0.35, 0.0]]), INT4_SYM)
    assert qw.scale.item() == pytest.approx(0.2)
    assert qw.codes.tolist() == [[4, -7, 2, 0]] and qw.zero_point is None
    assert qw.dequantize()[0].tolist() == pytest.approx([0.8, -1.4, 0.4, 0.0])


def test_asymmetric_int4_by_hand() -> None:
    # range [-0.5, 2.5] -> scale 3/15 = 0.2, zero point round(-8 + 0.5/0.2) = round(-5.5) = -6
    qw = quantize_rtn(torch.tensor([[2.5, -0.5, 1.0, 0.0]]), INT4_ASYM)
    assert qw.scale.item() == pytest.approx(0.2)
    assert qw.zero_point.tolist() == [[-6]]
    assert qw.codes.tolist() == [[6, -8, -1, -6]]  # round(w/s) + zp, clamped to [-8, 7]
    assert qw.dequantize()[0].tolist() == pytest.approx([2.4, -0.4, 1.0, 0.0])


def test_zero_is_exact_and_all_zero_groups_are_safe() -> None:
    w = torch.tensor([[0.0, 0.0, 0.0, 0.0, 3.0, -1.0, 0.0, 2.0]])
    for args in (INT4_SYM, INT4_ASYM):
        deq = quantize_rtn(w, args).dequantize()
        assert torch.equal(deq[:, :4], torch.zeros(1, 4)) and deq[0, 6] == 0


def test_fp8_per_channel_by_hand() -> None:
    args = WeightArgs(8, "float", "channel")
    qw = quantize_rtn(torch.tensor([[4.48, -2.24, 1.0]]), args)  # scale 4.48 / 448 = 0.01
    assert qw.scale.item() == pytest.approx(0.01)
    assert qw.codes.dtype == torch.float8_e4m3fn
    assert qw.codes.float().tolist() == [[448.0, -224.0, 96.0]]  # 100 rounds to 96 in e4m3


def test_scale_is_rounded_before_the_codes() -> None:
    w = torch.randn(8, 64)
    scale, _ = compute_qparams(w, WeightArgs(8, "int", "channel"), torch.bfloat16)
    assert scale.dtype == torch.bfloat16
    qw = quantize_rtn(w, WeightArgs(8, "int", "channel"), torch.bfloat16)
    # every code is within half a step of w / (stored scale), not of the unrounded scale
    assert ((w / qw.scale.float() - qw.codes.float()).abs() <= 0.5 + 1e-4).all()


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("args", [WeightArgs(8, "int", "channel", None, False), INT4_ASYM,
                                  WeightArgs(4, "int", "group", 16, False)])
def test_stored_scales_keep_every_weight_within_half_a_step(args, scale_dtype) -> None:
    """A 16-bit scale rounded down left a range's ends past the codes: bf16 scales clipped
    them by up to 1.45 steps on the embedded model's asymmetric W8A16."""
    torch.manual_seed(0)
    w = torch.randn(512, 256) * 0.02
    qw = quantize_rtn(w, args, scale_dtype)
    step = qw.scale.float().repeat_interleave(256 // qw.scale.shape[1], dim=1)
    assert ((w - qw.dequantize()).abs() <= 0.5 * step * (1 + 1e-6)).all()


def test_fp16_scales_of_tiny_fp8_rows_stay_positive() -> None:
    """|w| of 1e-6 gives a scale of ~1e-8, which fp16 rounded to 0: codes of w / 0."""
    torch.manual_seed(0)
    w = torch.randn(4, 64) * 2e-6
    w[0, ::3] = 0
    qw = quantize_rtn(w, WeightArgs(8, "float", "channel"), torch.float16)
    assert (qw.scale > 0).all() and not qw.codes.float().isnan().any()
    # e4m3's 3 mantissa bits; its subnormals' steps of 2^-9 scale units for the smallest
    assert torch.allclose(qw.dequantize(), w, rtol=2 ** -4, atol=float(qw.scale.max()) * 2 ** -10)


def test_group_size_must_divide_inputs() -> None:
    with pytest.raises(InferlabError, match="group size 128 does not divide its 576 inputs .try --group-size 64"):
        quantize_rtn(torch.zeros(4, 576), WeightArgs(4, "int", "group", 128))


def test_scheme_names_and_errors() -> None:
    assert make_scheme("w4a16", 64).weights == WeightArgs(4, "int", "group", 64, True)
    assert make_scheme("W8A8").activations == ActivationArgs("int")
    assert make_scheme("FP8_DYNAMIC").format == "float-quantized"
    assert make_scheme("W8A16").format == "pack-quantized"
    with pytest.raises(InferlabError, match="unknown scheme 'W3A16'"):
        make_scheme("W3A16")
    with pytest.raises(InferlabError, match="--asymmetric applies"):
        make_scheme("W8A8", asymmetric=True)


def test_compressed_tensors_groups_map_onto_schemes() -> None:
    group = {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
                         "symmetric": False}, "targets": ["Linear"]}
    assert scheme_from_ct_group(group, "g") == QuantScheme("custom", WeightArgs(4, "int", "group", 32, False))
    static = {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"},
              "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}}
    assert scheme_from_ct_group(static, "g") == QuantScheme(
        "custom", WeightArgs(8, "float", "tensor"), ActivationArgs("float", static=True))
    static_per_token = {**static, "input_activations": {**static["input_activations"], "strategy": "token"}}
    with pytest.raises(InferlabError, match="\\(dynamic\\), or per tensor \\(static\\)"):
        scheme_from_ct_group(static_per_token, "g")
    block = {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [64, 32]},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 32,
                                   "dynamic": True}}
    assert scheme_from_ct_group(block, "g") == QuantScheme(
        "custom", WeightArgs(8, "float", "block", 32, block_rows=64), ActivationArgs("float", group_size=32))
    narrower = {**block, "input_activations": {**block["input_activations"], "group_size": 16}}
    with pytest.raises(InferlabError, match="need weights in groups or blocks as wide"):
        scheme_from_ct_group(narrower, "g")
    with pytest.raises(InferlabError, match="need activations in groups as wide"):
        scheme_from_ct_group({**block, "input_activations": static["input_activations"]}, "g")
    with pytest.raises(InferlabError, match="3-bit int weights are not supported"):
        scheme_from_ct_group({"weights": {"num_bits": 3, "strategy": "channel"}}, "g")


def test_a_static_input_scale_maps_the_calibration_max_into_the_codes() -> None:
    """fp16 rounded a calibration of |x| <= 4e-6 to a scale of 0; rounded up, the largest |x|
    seen stays within the top code."""
    stats = InputStats(8, hessian=False, sample_rows=0)
    for top in (4e-6, 0.7):
        stats.add(torch.full((2, 8), top))
        for dtype, activations in ((torch.float16, ActivationArgs(FLOAT)), (torch.bfloat16, ActivationArgs(INT))):
            scale = static_input_scale(stats, activations, dtype)
            qmax = FP8_MAX if activations.kind == FLOAT else INT8_MAX
            assert scale.dtype == dtype and 0 < top / scale.item() <= qmax
