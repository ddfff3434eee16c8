"""Fixtures shared across the suite: the embedded model, its transformers twin, the data folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, the workers' OpenMP teams (torch's and the C kernels') share the cores:
    each may use them all while the other waits on Python or a subprocess, and its threads
    sleep at a barrier rather than spin, or two spinning teams on 2 cores run steps up to 10x
    slower. Set before torch loads libgomp; the servers and CLIs the tests start inherit it."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        os.environ["OMP_WAIT_POLICY"] = "passive"


def _shared_file(relative: str) -> Path:
    path = SHARED_DATA / relative
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared data folder sits beside the project)")
    return path


@pytest.fixture(scope="session")
def shared_file():
    """shared_file("wikitext-2-raw/wiki.test.raw"): a file under ../shared/data, or skip the test."""
    return _shared_file


@pytest.fixture(scope="session")
def embedded_gguf() -> str:
    from inferlab.models.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def hf_smollm(embedded_gguf):
    """transformers' own loading of the embedded GGUF file, fp32: the numerical reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(embedded_gguf), gguf_file=os.path.basename(embedded_gguf),
        dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_smollm_tokenizer(embedded_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(embedded_gguf),
                                         gguf_file=os.path.basename(embedded_gguf))


@pytest.fixture(scope="session")
def smollm_fp32(embedded_gguf):
    import torch

    from inferlab.models.loader import load_model

    return load_model(None, torch.float32)


@pytest.fixture
def one_line_error(capsys):
    """one_line_error(*ARGS): `inferlab ARGS`'s stderr, once it is checked to be the one line a
    user error gives (exit 2); run in this process, so a traceback fails the test as it escapes.
    tests/models/test_loader_errors.py's test_cli_prints_one_line_without_traceback runs the real
    process once."""
    from inferlab.cli import main

    def run(*args) -> str:
        capsys.readouterr()
        assert main(list(map(str, args))) == 2
        stderr = capsys.readouterr().err
        assert len(stderr.strip().splitlines()) == 1, stderr
        return stderr
    return run
