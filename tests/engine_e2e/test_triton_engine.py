"""The engine over its GPU kernels, run on CPU through the Triton interpreter.

A tiny random fp32 model whose attention (with the KV write), RMSNorm and RoPE are the Triton
kernels gives the tokens of the same model on the torch kernels: with decode steps run eagerly,
and through the CUDA-graph path's buffers, padding rows and graph metadata (the replay itself
needs a GPU; tests/engine_e2e/test_graphed_decode.py has that check).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from inferlab.engine.llm import LLM  # noqa: E402
from inferlab.engine.sampling_params import SamplingParams  # noqa: E402
from inferlab.kernels import fused, triton_norm_rope  # noqa: E402
from inferlab.kernels.attention import triton_paged  # noqa: E402
from inferlab.models import llama  # noqa: E402
from inferlab.models.config import ModelConfig  # noqa: E402
from inferlab.models.loader import LoadedModel  # noqa: E402

from .conftest import use_graph_runner  # noqa: E402

VOCAB = 256


@pytest.fixture(scope="module")
def tiny(smollm_fp32) -> LoadedModel:
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=VOCAB, hidden_size=64,
                      intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, max_position_embeddings=256)
    torch.manual_seed(0)
    model = llama.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    # the tokenizer only supplies an EOS id (ignored here): requests carry token ids
    return LoadedModel(model, cfg, smollm_fp32.tokenizer, name="tiny", path="")


def _generate(llm: LLM) -> tuple[list[list[int]], list[float]]:
    """Greedy tokens of three requests, and the logprob of every token chosen."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (5, 23, 40)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, detokenize=False,
                             logprobs=0) for m in (4, 7, 10)]
    outs = [o.outputs[0] for o in llm.generate(prompts, params)]
    return [o.token_ids for o in outs], [lp.logprob for o in outs for lp in o.logprobs]


def _use_triton_kernels(monkeypatch) -> None:
    monkeypatch.setattr(llama, "paged_attention", triton_paged.paged_attention)
    monkeypatch.setattr(llama, "rotary_embedding", triton_norm_rope.rotary_embedding)
    monkeypatch.setattr(fused, "rms_norm", triton_norm_rope.rms_norm)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph path"])
def test_the_triton_kernels_give_the_torch_kernels_tokens(tiny, monkeypatch, graphs) -> None:
    def llm() -> LLM:
        return LLM(loaded=tiny, dtype="float32", kv_cache_memory="4MiB", max_num_batched_tokens=32,
                   max_num_seqs=32)

    expected = _generate(llm())
    _use_triton_kernels(monkeypatch)
    ours = llm()
    sizes = use_graph_runner(ours, max_batch=4) if graphs else []
    tokens, logprobs = _generate(ours)
    assert tokens == expected[0]
    # the interpreter's fp32 sums run in another order than torch's
    assert logprobs == pytest.approx(expected[1], abs=1e-4)
    if graphs:  # decode steps of 3, 2 and 1 sequences, run padded to 4, 2 and 1
        assert sorted(set(sizes)) == [1, 2, 3]
