"""`from inferlab import LLM, SamplingParams` works as in vLLM (once an ImportError), and
`import inferlab`, which every CLI command runs, still leaves torch out."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_package_leaves_torch_out():
    assert _run("import sys, inferlab; print('torch' in sys.modules)") == "False"


def test_llm_and_sampling_params_are_the_engines():
    import inferlab
    from inferlab import LLM, SamplingParams
    from inferlab.engine.llm import LLM as EngineLLM
    from inferlab.engine.sampling_params import SamplingParams as EngineSamplingParams

    assert (LLM, SamplingParams) == (EngineLLM, EngineSamplingParams)
    assert {"LLM", "SamplingParams"} <= set(dir(inferlab))


def test_other_names_are_still_attribute_errors_or_submodules():
    import inferlab

    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        inferlab.Engine  # noqa: B018
    from inferlab import errors  # a submodule, imported as before

    assert errors.InferlabError
