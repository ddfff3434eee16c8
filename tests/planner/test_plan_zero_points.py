"""Checkpoints `inferlab quantize` writes: the planner counts the bytes their tensors hold,
zero points of asymmetric schemes, layers the config leaves dense and each strategy's scales
included."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from inferlab.cli import main
from inferlab.errors import InferlabError
from inferlab.planner.memory import weight_format
from tests.quant.tiny import calibration_text, tiny_model_dir

pytest.importorskip("transformers")


def _tensor_bytes(path: Path) -> int:
    """Bytes of a safetensors file's tensors, from its header alone; each linear's weight_shape
    (two int64, metadata the loader reads and drops) left out."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return sum(end - start for name, entry in header.items() if not name.endswith(".weight_shape")
               for start, end in [entry["data_offsets"]])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    return tiny_model_dir(folder / "model"), calibration_text(folder / "calib.txt", words=400)


@pytest.mark.parametrize(("scheme", "group", "fmt"), [
    ("W4A16", "32", "int4-g32-asym"),  # zero points int32 [N / 8, K / 32]: 4 bits each
    ("W8A16", None, "int8-wo-asym"),  # int32 [N / 4, 1]: 8 bits each
    ("W4A16", "32", "int4-g32"),  # symmetric: no zero points
])
def test_planned_weight_bytes_are_the_checkpoints(tiny, tmp_path, capsys, scheme, group, fmt):
    """Once 0.7% short on an asymmetric W4A16 SmolLM2 (its 829,440 B of zero points)."""
    asymmetric = [] if fmt.endswith("-g32") else ["--asymmetric"]
    out = _quantize(tiny, tmp_path, capsys, "--scheme", scheme, *asymmetric,
                    *(["--group-size", group] if group else []))
    expected = _tensor_bytes(out / "model.safetensors")
    for chosen in ([], ["--weight-format", fmt]):  # the checkpoint's own format, then named
        weights = _planned_weights(capsys, out, *chosen)
        assert weights["format"] == fmt
        assert weights["total_bytes"] == expected


@pytest.mark.parametrize(("argv", "fmt", "scales"), [
    # the MLPs left bf16: one scale per output row of q, k, v, o: 2 layers × (64 + 32 + 32 + 64)
    (["--scheme", "W8A16", "--ignore", "lm_head", "re:.*mlp.*"], "int8-wo", 2 * 192),
    # lm_head quantized too: 2 × (192 + 96 + 96 + 64) rows + its 160
    (["--scheme", "W8A16", "--ignore"], "int8-wo", 2 * 448 + 160),
    # one weight scale per layer, and one static input scale: 2 layers × 7 × 2
    (["--scheme", "FP8"], "fp8-tensor", 28),
    # a scale per 32 × 32 block: 2 layers × (2 × 2 q + 1 × 2 k + 1 × 2 v + 2 × 2 o + 3 × 2 gate
    # + 3 × 2 up + 2 × 3 down)
    (["--scheme", "FP8_BLOCK", "--group-size", "32"], "fp8-b32x32", 60),
])
def test_planned_layers_and_scales_are_the_checkpoints(tiny, tmp_path, capsys, argv, fmt, scales):
    """Once every block linear was costed quantized whatever the config's ignore list (the MLPs
    left bf16 planned at 1 B a weight), lm_head always bf16, and per-tensor or per-block
    scales counted one per output row."""
    out = _quantize(tiny, tmp_path, capsys, *argv)
    weights = _planned_weights(capsys, out)
    assert weights["format"] == fmt and weights["num_scales"] == scales
    assert weights["total_bytes"] == _tensor_bytes(out / "model.safetensors")
    assert main(["info", str(out), "--json"]) == 0  # `inferlab info` counts the same layers
    assert json.loads(capsys.readouterr().out)["weight_bytes"] == weights["total_bytes"]


def _quantize(tiny: tuple[Path, Path], tmp_path: Path, capsys, *argv: str) -> Path:
    """`inferlab quantize` the tiny model (bf16: the planner's dense dtype) into tmp_path/q."""
    model, calib = tiny
    out = tmp_path / "q"
    # FP8's static input scales calibrate; the other schemes, by rtn, refuse calibration flags
    calibration = ["--calib", str(calib), "--num-samples", "2", "--seq-len", "16"] if "FP8" in argv else []
    assert main(["quantize", str(model), "--dtype", "bfloat16", "--out", str(out), *calibration,
                 "--quiet", *argv]) == 0
    capsys.readouterr()
    return out


def _planned_weights(capsys, model: Path, *argv: str) -> dict:
    assert main(["plan", str(model), "--hardware", "L4", "--workload", "prompt=64,output=16",
                 "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)["weights"]


def test_zero_points_go_only_with_weight_only_formats():
    assert not weight_format("INT4-G128-ASYM").symmetric
    for name in ("int8-asym", "bf16-asym", "fp8-asym"):
        with pytest.raises(InferlabError, match="only weight-only formats"):
            weight_format(name)
    with pytest.raises(InferlabError, match="did you mean int4-g128-asym"):
        weight_format("int4-g128-asymm")
