"""Fixtures shared across the suite: the embedded model, its transformers twin, the data folder."""

from __future__ import annotations

import os
import shutil
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


def _transformers_copy(gguf_path: str, name: str, convert, save, load):
    """convert(): transformers' own reading of the GGUF file, saved once (save(obj, dir)) in the
    project's cache and read back from there (load(dir)): its GGUF path parses the file with
    gguf-py in Python, 35 s for the model and 10 s for the tokenizer on 2 cores, the saved copy
    about a second. A worker that finds no copy converts and publishes one whole (a rename; a
    second such worker drops its own). No lock: the conversion runs on one core, so two workers
    converting side by side took 61.6 s where one converting while the other waited took 91.5
    (the greedy and tokenizer tests from an empty cache, -n 2)."""
    import tempfile

    import transformers

    from inferlab.kernels.cpu_library import cache_dir

    info = os.stat(gguf_path)
    saved = (cache_dir() / "transformers-copies" / f"{info.st_size}-{info.st_mtime_ns}-{transformers.__version__}"
             / name)
    if saved.is_dir():
        return load(saved)
    converted = convert()
    saved.parent.mkdir(parents=True, exist_ok=True)
    staging = tempfile.mkdtemp(dir=saved.parent)
    save(converted, Path(staging))
    try:
        os.replace(staging, saved)
    except OSError:  # another worker's is there
        shutil.rmtree(staging, ignore_errors=True)
    return converted


@pytest.fixture(scope="session")
def hf_smollm(embedded_gguf):
    """transformers' own loading of the embedded GGUF file, fp32: the numerical reference. Its
    weights are kept with safetensors (transformers will not save a model it read from a GGUF)."""
    import safetensors.torch
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def save(model, where: Path) -> None:
        model.config.save_pretrained(where)
        safetensors.torch.save_model(model, str(where / "model.safetensors"))

    def load(where: Path):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(where), dtype=torch.float32)
        safetensors.torch.load_model(model, str(where / "model.safetensors"))
        return model

    def convert():
        return AutoModelForCausalLM.from_pretrained(os.path.dirname(embedded_gguf),
                                                    gguf_file=os.path.basename(embedded_gguf), dtype=torch.float32)

    return _transformers_copy(embedded_gguf, "model", convert, save, load).eval()


@pytest.fixture(scope="session")
def hf_smollm_tokenizer(embedded_gguf):
    from transformers import AutoTokenizer

    return _transformers_copy(
        embedded_gguf, "tokenizer",
        lambda: AutoTokenizer.from_pretrained(os.path.dirname(embedded_gguf), gguf_file=os.path.basename(embedded_gguf)),
        lambda tokenizer, where: tokenizer.save_pretrained(where), AutoTokenizer.from_pretrained)


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
