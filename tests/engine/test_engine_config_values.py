"""Pure checks of EngineConfig's values: vLLM's dtype names (ModelDType) for EngineConfig and
--dtype, InferlabError as a ValueError (vLLM raises ValueError for the same bad input), a config
refusal's own message, and step limits out of range named as set."""

from __future__ import annotations

import argparse

import pytest
import torch

from inferlab.config import EngineConfig
from inferlab.engine.args import add_engine_args, engine_config_from_args
from inferlab.errors import InferlabError, InvalidParameterError, ModelLoadError
from inferlab.models.config import ModelConfig

# vLLM's _STR_DTYPE_TO_TORCH_DTYPE: half and float16, float and float32, bfloat16
VLLM_DTYPES = [("half", "float16"), ("float16", "float16"), ("float", "float32"),
               ("float32", "float32"), ("bfloat16", "bfloat16"), ("auto", "auto"),
               (torch.float16, "float16"), (torch.half, "float16"), (torch.bfloat16, "bfloat16"),
               (torch.float32, "float32"), ("Half", "float16")]


@pytest.mark.parametrize(("dtype", "name"), VLLM_DTYPES)
def test_engine_config_takes_vllms_dtype_names(dtype, name):
    assert EngineConfig(dtype=dtype).dtype == name


@pytest.mark.parametrize("dtype", ["float64", torch.float64, torch.int8, "fp16", 16, None])
def test_other_dtypes_are_refused(dtype):
    with pytest.raises(InferlabError, match="dtype must be"):
        EngineConfig(dtype=dtype)


@pytest.mark.parametrize(("flag", "name"), [("half", "float16"), ("float", "float32")])
def test_the_dtype_flag_takes_them(flag, name):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_config_from_args(parser.parse_args(["--dtype", flag])).dtype == name


def test_the_long_prefill_flag_reaches_the_config_and_a_bad_one_is_refused_before_loading():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--long-prefill-token-threshold", "1k"])
    assert engine_config_from_args(args).long_prefill_token_threshold == 1000
    assert EngineConfig().long_prefill_token_threshold == 0
    with pytest.raises(InferlabError, match="needs chunked prefill"):
        engine_config_from_args(parser.parse_args(["--long-prefill-token-threshold", "64",
                                                   "--no-enable-chunked-prefill"]))
    with pytest.raises(InferlabError, match="must be a whole number"):
        EngineConfig(long_prefill_token_threshold=2.5)


def test_user_errors_are_value_errors():
    for error in (InferlabError, InvalidParameterError, ModelLoadError):
        assert issubclass(error, ValueError)
    with pytest.raises(ValueError, match="max_model_len must be at least 1"):
        EngineConfig(max_model_len=0)


def test_a_config_refusal_keeps_its_own_message():
    """from_hf_dict turns ValueErrors into "invalid value (...)"; a ModelLoadError, a ValueError
    now, is passed on as it is rather than wrapped in a second copy of its source."""
    cfg = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 2, "num_hidden_layers": 1,
           "hidden_size": 64, "intermediate_size": 128, "vocab_size": 100,
           "max_position_embeddings": 64, "mlp_bias": True}
    with pytest.raises(ModelLoadError) as caught:
        ModelConfig.from_hf_dict(cfg)
    assert str(caught.value) == "config.json: mlp_bias (biases in the MLP) is not supported"


@pytest.mark.parametrize(("fields", "message"), [
    # the batch budget's own name: it once stood in for the unknown context and was blamed on it
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be at least 1, got 0"),
    ({"max_num_batched_tokens": -5}, "max_num_batched_tokens must be at least 1, got -5"),
    ({"max_num_seqs": 0}, "max_num_seqs must be at least 1, got 0"),
])
def test_a_step_limit_out_of_range_is_named_as_set(fields, message):
    with pytest.raises(InferlabError) as caught:
        EngineConfig(**fields)
    assert str(caught.value) == message
