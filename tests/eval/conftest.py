"""Tiny character-level models and a text they can read, built once per test session."""

from __future__ import annotations

import pytest
from eval_helpers import make_char_model, sample_text


@pytest.fixture(scope="session")
def char_models(tmp_path_factory):
    """(directory, transformers model) of a tiny Llama, and of a perturbed copy of it."""
    root = tmp_path_factory.mktemp("eval_models")
    base_dir, other_dir = root / "base", root / "perturbed"
    base = make_char_model(base_dir, seed=0)
    perturbed = make_char_model(other_dir, seed=0, noise=0.02)
    return (base_dir, base), (other_dir, perturbed)


@pytest.fixture(scope="session")
def char_text_file(tmp_path_factory):
    """500 characters (= 500 tokens) of text, with CRLF line ends as WikiText ships them."""
    path = tmp_path_factory.mktemp("eval_data") / "text.raw"
    path.write_bytes(sample_text(500).replace("\n", "\r\n").encode())
    return path
