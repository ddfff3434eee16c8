"""Where a C compiler is present the CPU kernels must build: every kernel test skips when the
library is missing, so a source that stopped compiling would otherwise pass as "no compiler"."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from inferlab.kernels import cpu_library


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")
def test_the_kernels_build_where_a_compiler_is():
    try:
        library = cpu_library._build(cpu_library.SOURCES)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the CPU kernels do not compile:\n{exc.stderr[:3000]}")
    assert library.is_file()


def test_a_cached_build_is_reused_only_on_the_same_kind_of_cpu(tmp_path, monkeypatch):
    """-march=native code from one CPU can fault on another, so the cache key holds the CPU."""
    compiled = []

    def fake_compiler(cmd, **kwargs):
        out = cmd[cmd.index("-o") + 1]
        compiled.append(out)
        open(out, "wb").close()

    monkeypatch.setenv("INFERLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_library.subprocess, "run", fake_compiler)
    monkeypatch.setattr(cpu_library, "_cpu_features", lambda: b"flags: avx512f amx_tile")
    intel = cpu_library._build(cpu_library.SOURCES)
    assert cpu_library._build(cpu_library.SOURCES) == intel and len(compiled) == 1
    monkeypatch.setattr(cpu_library, "_cpu_features", lambda: b"flags: avx512f")
    amd = cpu_library._build(cpu_library.SOURCES)
    assert amd != intel and len(compiled) == 2 and amd.is_file() and intel.is_file()


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")
@pytest.mark.parametrize("march", ["x86-64-v3", "skylake-avx512", "cooperlake"])
def test_the_kernels_build_and_load_for_a_cpu_without_amx(march, tmp_path):
    """The sources sit behind #ifdef __AVX512BF16__ and __AMX_BF16__; a helper used outside its
    guard but defined inside it fails to build or to load on the CPUs the guard leaves out, and
    this machine (with AMX) never sees it: AVX2 only (a helper compiled with a warning, then an
    undefined symbol), AVX-512 without BF16 (the sampler's vector loop took an exp defined for
    BF16 only) and AVX-512-BF16 without AMX (the prefill softmax job was defined inside the AMX
    guard). Built for each, the library must load. -O0: every call stays a call, so a helper
    missing outside its guard is an undefined symbol still (and -O1 took 11 s for cooperlake)."""
    import ctypes

    out = tmp_path / f"cpu_ops_{march}.so"
    cmd = [os.environ.get("CC", "cc"), "-O0", f"-march={march}", "-fopenmp", "-shared", "-fPIC",
           "-std=gnu11", "-Werror=implicit-function-declaration", "-o", str(out),
           *map(str, cpu_library.SOURCES), "-lm"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[:3000]
    library = ctypes.CDLL(str(out))
    assert library.has_amx() == 0
