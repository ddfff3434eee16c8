"""The C kernels' AVX512 paths, which CPUs without AMX run: the kernel tests again in a process
with INFERLAB_CPU_AMX=0 (this machine has AMX, so they would otherwise never run here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferlab.kernels import cpu_ops

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (cpu_ops.available(torch.zeros(1)) and cpu_ops.amx_available()),
                                reason="no AMX here: the other tests already run the AVX512 paths")


def test_kernels_pass_on_their_avx512_paths() -> None:
    env = {**os.environ, "INFERLAB_CPU_AMX": "0"}
    probe = "from inferlab.kernels import cpu_ops; print(cpu_ops.amx_available())"
    assert subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    tests = ["tests/kernels/test_cpu_ops.py", "tests/kernels/test_cpu_attention.py",
             "tests/kernels/test_cpu_model.py", "tests/kernels/test_cpu_linear.py",
             "tests/quant/test_linear.py", "tests/quant/test_dynamic_linear.py"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                         env=env, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
