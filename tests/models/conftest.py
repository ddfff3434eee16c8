"""Fixtures shared by the model-loading tests."""

from __future__ import annotations

import pytest

from tests.quant.tiny import write_tokenizer

from .tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A whole model folder: config, weights and a tokenizer (`inferlab info` reads all three)."""
    directory = tmp_path_factory.mktemp("tiny")
    make_tiny_model("llama", directory)
    write_tokenizer(directory)
    return directory
