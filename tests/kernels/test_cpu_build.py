"""Where a C compiler is present the CPU kernels must build: every kernel test skips when the
library is missing, so a source that stopped compiling would otherwise pass as "no compiler"."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from inferlab.kernels import cpu_ops


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")
def test_the_kernels_build_where_a_compiler_is():
    try:
        library = cpu_ops._build(cpu_ops.SOURCES)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the CPU kernels do not compile:\n{exc.stderr[:3000]}")
    assert library.is_file()
