"""A tied checkpoint (tie_word_embeddings) that stores lm_head.weight beside the embedding, or
instead of it, loads as transformers and vLLM load it: both were once refused as an unexpected
tensor or missing tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferlab.models.loader import load_network

from .paged_harness import run_schedule
from .tiny_models import make_tiny_model

PROMPT = [5, 17, 3, 99, 42, 7, 150, 1, 64]


def _rewrite_weights(directory, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _store_head_too(tensors) -> None:
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()


def _store_head_only(tensors) -> None:
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")


@pytest.mark.parametrize("edit", [_store_head_too, _store_head_only])
def test_a_tied_checkpoint_with_its_head_gives_transformers_logits(tmp_path, edit):
    make_tiny_model("llama", tmp_path)  # tied
    _rewrite_weights(tmp_path, edit)
    import transformers

    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with torch.no_grad():
        expected = reference.eval()(torch.tensor([PROMPT])).logits[0]
    ours, cfg = load_network(str(tmp_path), torch.float32)
    assert cfg.tie_word_embeddings
    assert ours.lm_head.weight is ours.model.embed_tokens.weight  # still one matrix
    got = run_schedule(ours, [PROMPT], [[(0, len(PROMPT))]])[0]
    assert (got - expected).abs().max().item() < 1e-4


def test_the_embedding_wins_over_a_different_stored_head(tmp_path):
    """vLLM skips lm_head.* of a tied model: the head is the embedding, whatever is stored."""
    reference = make_tiny_model("llama", tmp_path)
    _rewrite_weights(tmp_path, lambda t: t.update({"lm_head.weight": torch.zeros_like(
        t["model.embed_tokens.weight"])}))
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT])).logits[0]  # built tied, before the edit
    ours, _ = load_network(str(tmp_path), torch.float32)
    got = run_schedule(ours, [PROMPT], [[(0, len(PROMPT))]])[0]
    assert (got - expected).abs().max().item() < 1e-4
