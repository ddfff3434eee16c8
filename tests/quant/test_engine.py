"""A quantized checkpoint served by the engine generates what transformers generates from the
same checkpoint's weights, dequantized by the compressed-tensors library."""

from __future__ import annotations

import random

import pytest
import torch

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.quant.linear import QuantLinear
from inferlab.quant.recipe import Recipe
from inferlab.quant.run import quantize_to_directory
from inferlab.quant.scheme import make_scheme

from .tiny import tiny_model_dir

pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

NEW_TOKENS = 8
_RNG = random.Random(7)
PROMPT = [_RNG.randrange(3, 160) for _ in range(11)]


def _reference(directory) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy generate over the library's dequantized weights, fp32: the tokens
    and each step's log-probabilities."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        out = model.eval().generate(torch.tensor([PROMPT]), generation_config=config)
    tokens = out.sequences[0, len(PROMPT):].tolist()
    return tokens, [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]


@pytest.mark.parametrize(("scheme", "group"), [("W4A16", 32), ("W8A16", 128)])
def test_engine_generates_like_transformers_on_the_dequantized_weights(tmp_path, scheme: str,
                                                                      group: int) -> None:
    source = tiny_model_dir(tmp_path / "src")
    out = tmp_path / "out"
    quantize_to_directory(str(source), Recipe(make_scheme(scheme, group), "rtn"), str(out),
                          calib="", num_samples=1, seq_len=8, batch_size=1, seed=0,
                          dense_dtype="auto", progress=False)
    llm = LLM(str(out), dtype="float32", kv_cache_memory="4MiB")
    layer = llm.engine.loaded.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear)  # served compressed, not dequantized
    assert isinstance(layer.mlp.down_proj, QuantLinear)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=1)
    completion = llm.generate([PROMPT], params)[0].outputs[0]
    tokens, logprobs = _reference(out)
    assert len(tokens) == NEW_TOKENS and completion.token_ids == tokens
    assert completion.logprobs is not None
    for step, want in zip(completion.logprobs, logprobs, strict=True):
        # the fp32 tolerance tests/quant uses for these weight-only schemes
        assert abs(step.logprob - want[step.token_id].item()) < 1e-4
