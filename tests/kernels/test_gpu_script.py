"""benchmarks/gpu.py, the one script a lent GPU runs, must work when that rare GPU comes: its
--smoke run goes through every section on CPU with a tiny model and must report no failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu.py"


def test_the_gpu_script_runs_every_section_on_cpu(tmp_path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 failed check(s)" in done.stdout
    for section in ("kernels", "greedy", "8B bf16", "vs HF", "quantized"):
        assert f"  {section} " in done.stdout, section
    assert out.is_file()
