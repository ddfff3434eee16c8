"""Checkpoints `inferlab quantize` writes: the planner counts the bytes their tensors hold,
zero points of asymmetric schemes included."""

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
    model, calib = tiny
    out = tmp_path / "q"
    argv = ["quantize", str(model), "--scheme", scheme, "--dtype", "bfloat16", "--out", str(out),
            "--calib", str(calib), "--num-samples", "2", "--seq-len", "16", "--quiet"]
    argv += [] if fmt.endswith("-g32") else ["--asymmetric"]
    assert main([*argv, *(["--group-size", group] if group else [])]) == 0
    capsys.readouterr()
    expected = _tensor_bytes(out / "model.safetensors")
    for chosen in ([], ["--weight-format", fmt]):  # the checkpoint's own format, then named
        assert main(["plan", str(out), "--hardware", "L4", "--workload", "prompt=64,output=16",
                     "--json", *chosen]) == 0
        weights = json.loads(capsys.readouterr().out)["weights"]
        assert weights["format"] == fmt
        assert weights["total_bytes"] == expected


def test_zero_points_go_only_with_weight_only_formats():
    assert not weight_format("INT4-G128-ASYM").symmetric
    for name in ("int8-asym", "bf16-asym", "fp8-asym"):
        with pytest.raises(InferlabError, match="only weight-only formats"):
            weight_format(name)
    with pytest.raises(InferlabError, match="did you mean int4-g128-asym"):
        weight_format("int4-g128-asymm")
