"""The kernels are the bottom layer: importing every module of inferlab.kernels, in a fresh
interpreter, loads no other inferlab package (the quantized layers, the models, the engine
build on the kernels, never the other way round)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import importlib, pkgutil, sys
import inferlab.kernels
for module in pkgutil.walk_packages(inferlab.kernels.__path__, "inferlab.kernels."):
    importlib.import_module(module.name)
print(" ".join(sorted(name for name in sys.modules
                      if name.startswith("inferlab.") and not name.startswith("inferlab.kernels"))))
"""


def test_the_kernels_import_nothing_above_them():
    run = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["inferlab.errors"]  # the shared error type only
