"""The benchmark is a client: importing any of it must not import torch or the engine."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import inferlab.bench
names = sorted(m.name for m in pkgutil.walk_packages(inferlab.bench.__path__, "inferlab.bench."))
for name in names:
    importlib.import_module(name)
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.",
               "inferlab.engine", "inferlab.models", "inferlab.kernels", "transformers")))
print(len(names), heavy)
"""


def test_importing_every_bench_module_leaves_torch_out():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    count, heavy = done.stdout.split(" ", 1)
    assert int(count) >= 20 and heavy.strip() == "[]"


def test_the_bench_command_line_leaves_torch_out():
    code = ("import sys; from inferlab.cli import build_parser; build_parser(['bench']); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
