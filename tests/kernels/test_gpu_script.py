"""What the rare lent GPU runs must work when it comes: benchmarks/gpu.py's --smoke run goes
through every section on CPU with a tiny model and must report no failure, and the GPU path
must not stop to build the CPU kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from inferlab.kernels import cpu_ops

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


def test_the_gpu_script_runs_every_section_on_cpu(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 failed check(s)" in done.stdout
    for section in ("kernels", "greedy", "speculative", "8B bf16", "vs HF", "quantized", "memory"):
        assert f"  {section} " in done.stdout, section
    assert "a dropped engine is freed by reference counting" in done.stdout
    assert out.is_file()


def test_tensors_off_the_cpu_never_build_the_cpu_kernels(monkeypatch) -> None:
    """A GPU forward asks cpu_ops.available about its tensors first thing: the answer must come
    from their device, not from compiling the C library (seconds of gcc). The meta device
    stands in for CUDA here: anything but "cpu" must answer without the library."""

    def no_build() -> None:
        raise AssertionError("the CPU kernels were built for tensors that are not on the CPU")

    monkeypatch.setattr(cpu_ops, "_library", no_build)
    off_cpu = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    on_cpu = torch.empty(4, 8, dtype=torch.bfloat16)
    assert not cpu_ops.available(off_cpu)
    assert not cpu_ops.available(on_cpu, off_cpu)
    assert not cpu_ops.available(torch.empty(4, dtype=torch.int64))  # a dtype no kernel takes
    monkeypatch.setattr(cpu_ops, "_library", lambda: None)  # no compiler: CPU tensors too say no
    assert not cpu_ops.available(on_cpu)
    monkeypatch.setattr(cpu_ops, "_library", object)  # built: CPU tensors of one dtype say yes
    assert cpu_ops.available(on_cpu, torch.zeros(2, dtype=torch.bfloat16))
