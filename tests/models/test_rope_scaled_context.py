"""Linear and YaRN RoPE scaling stretch the context past max_position_embeddings, as vLLM
derives it (_get_and_verify_max_len) and as transformers computes it. The context once stopped at
max_position_embeddings, and the RoPE table with it."""

from __future__ import annotations

import json
import random

import pytest
import torch

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.cli import model_info
from inferlab.models.config import ModelConfig
from inferlab.models.loader import load_network

from .paged_harness import run_schedule
from .tiny_models import COMMON
from .tiny_tokenizer import save_tokenizer

POSITIONS = 64  # max_position_embeddings of the models below
# name -> (transformers architecture, rope_scaling, the context vLLM derives: worked by hand,
# other top-level config fields)
SCALED = {
    "linear": ("Llama", {"rope_type": "linear", "factor": 4.0}, 4 * POSITIONS, {}),
    # YaRN counts from original_max_position_embeddings
    "yarn": ("Qwen2", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 48},
             4 * 48, {}),
    # Phi-3's spelling, outside the dict, which transformers puts first: it was passed over (the
    # tables then counted from 64 positions: logprobs off by up to 2.9 against transformers')
    "yarn_outside": ("Llama", {"rope_type": "yarn", "factor": 4.0}, 4 * 40,
                     {"original_max_position_embeddings": 40}),
}


def _hf_dict(rope_scaling: dict | None, positions: int = POSITIONS) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "max_position_embeddings": positions, "rope_scaling": rope_scaling}


@pytest.mark.parametrize(("scaling", "context"), [
    (None, 64),
    ({"rope_type": "linear", "factor": 4.0}, 256),
    ({"type": "linear", "factor": 2.5}, 160),  # the older key
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, 128),
    ({"rope_type": "yarn", "factor": 2.0}, 128),  # original defaults to max_position_embeddings
    # llama3's max_position_embeddings is already the long one: vLLM leaves it alone
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}, 64),
])
def test_the_derived_context_is_vllms(scaling, context):
    assert ModelConfig.from_hf_dict(_hf_dict(scaling)).max_context == context


@pytest.mark.parametrize(("scaling", "message"), [
    ({"rope_type": "yarn", "factor": "4"}, "rope scaling 'yarn' needs a positive number factor, "
                                           "got '4'"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": -32},
     "needs a positive number original_max_position_embeddings, got -32"),
])
def test_yarns_numbers_are_checked_where_given(scaling, message):
    """A string factor once made the context its 64 repeats, read as a number."""
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_hf_dict(_hf_dict(scaling))


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize(("scaling", "fields", "message"), [
    # each once a traceback when the model was built (float('x'), float(None), a list times a float)
    ({**LLAMA3, "low_freq_factor": "x"}, {}, "'llama3' needs a positive number low_freq_factor, got 'x'"),
    ({"rope_type": "yarn", "factor": 4.0, "beta_fast": "fast"}, {}, "needs a positive number beta_fast"),
    ({"rope_type": "yarn", "factor": 4.0, "mscale": [1]}, {}, "needs a positive number mscale, got [1]"),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": "big"}, {}, "positive number attention_factor"),
    ({**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 4.0}, {},  # the blend divided by 0
     "needs high_freq_factor (4.0) above low_freq_factor (4.0)"),
    # transformers refuses the first; the second was read as 10000
    (None, {"rms_norm_eps": -1}, "rms_norm_eps must be a positive number, got -1.0"),
    (None, {"rope_theta": 0}, "rope_theta must be a positive number, got 0.0"),
    (None, {"rope_theta": True}, "rope_theta must be a number, got 'True'"),  # was read as 1.0
    (None, {"rms_norm_eps": True}, "rms_norm_eps must be a number, got 'True'"),
    (None, {"rms_norm_eps": "1e-5"}, "rms_norm_eps must be a number, got '1e-5'"),
    (None, {"rope_theta": 10 ** 400}, "rope_theta must be a number, got '1000000000"),  # an OverflowError traceback
])
def test_a_bad_rope_or_norm_number_is_a_one_line_config_error(scaling, fields, message):
    with pytest.raises(ModelLoadError) as failed:
        ModelConfig.from_hf_dict({**_hf_dict(scaling), **fields})
    assert message in str(failed.value) and "\n" not in str(failed.value)


def test_a_zero_beta_or_mscale_is_unset_as_transformers_reads_it():
    """DeepSeek-style mscale 0.707 with mscale_all_dim 0 loads in transformers (0: not set)."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0, "beta_fast": 0}
    config = ModelConfig.from_hf_dict(_hf_dict(scaling))
    from inferlab.models.layers import rope_frequencies

    given = rope_frequencies(8, 10000.0, config.rope_scaling, 64)
    unset = rope_frequencies(8, 10000.0, {"rope_type": "yarn", "factor": 4.0, "mscale": 0.707}, 64)
    assert torch.equal(given[0], unset[0]) and given[1] == unset[1]


def test_a_null_optional_rope_number_takes_its_default():
    """high_freq_factor null: float(None) once; now 4, as when it is left out."""
    config = ModelConfig.from_hf_dict(_hf_dict({**LLAMA3, "high_freq_factor": None}))
    from inferlab.models.layers import rope_frequencies

    given, _ = rope_frequencies(4, 10000.0, config.rope_scaling, 64)
    default, _ = rope_frequencies(4, 10000.0, LLAMA3, 64)
    assert torch.equal(given, default)


def test_an_outside_original_length_serves_llama3_too():
    """transformers moves a top-level original_max_position_embeddings into llama3's dict; it
    was 'needs a positive number original_max_position_embeddings'."""
    scaling = {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}
    config = ModelConfig.from_hf_dict({**_hf_dict(scaling), "original_max_position_embeddings": 8})
    assert config.rope_scaling["original_max_position_embeddings"] == 8


def test_a_sliding_window_still_caps_a_stretched_context():
    cfg = {**_hf_dict({"rope_type": "linear", "factor": 4.0}), "architectures": ["MistralForCausalLM"],
           "sliding_window": 100, "num_key_value_heads": 2}  # MistralConfig's default is 8
    assert ModelConfig.from_hf_dict(cfg).max_context == 100


@pytest.fixture(scope="module", params=sorted(SCALED))
def scaled(request, tmp_path_factory):
    """(model directory, transformers' model, the context vLLM derives)."""
    import transformers

    architecture, rope_scaling, context, top_level = SCALED[request.param]
    config = getattr(transformers, f"{architecture}Config")(
        **{**COMMON, "max_position_embeddings": POSITIONS, "rope_scaling": rope_scaling, **top_level})
    torch.manual_seed(0)
    reference = getattr(transformers, f"{architecture}ForCausalLM")(config).eval()
    directory = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(directory, safe_serialization=True)
    save_tokenizer(directory)
    if top_level:  # transformers writes them into the RoPE dict: put them back outside
        saved = json.loads((directory / "config.json").read_text())
        for params in (saved.get("rope_parameters"), saved.get("rope_scaling")):
            for key in top_level:
                (params or {}).pop(key, None)
        (directory / "config.json").write_text(json.dumps({**saved, **top_level}))
    return directory, reference, context


def test_logits_past_the_original_positions_equal_transformers(scaled):
    directory, reference, context = scaled
    ours, _ = load_network(str(directory), torch.float32)
    rng = random.Random(0)
    seqs = [[rng.randrange(160) for _ in range(n)] for n in (context, 3 * POSITIONS // 2)]
    with torch.no_grad():
        expected = [reference(torch.tensor([s])).logits[0] for s in seqs]
    # a prefill to past the original positions, then a token at a time to the end
    steps = [[(0, POSITIONS + 5), (1, POSITIONS + 5)]]
    steps += [[(i, 1) for i, s in enumerate(seqs) if len(s) > t] for t in range(POSITIONS + 5, context)]
    for got, want in zip(run_schedule(ours, seqs, steps), expected, strict=True):
        assert (got - want).abs().max().item() < 1e-4


def test_the_engine_serves_the_derived_context(scaled):
    directory, reference, context = scaled
    llm = LLM(str(directory), dtype="float32", kv_cache_memory="8MiB")
    assert llm.engine.max_model_len == context
    with pytest.raises(InferlabError, match=f"max_model_len {context + 1} is over the model's "
                                            f"{context} positions"):
        LLM(str(directory), dtype="float32", kv_cache_memory="8MiB", max_model_len=context + 1)
    prompt = [random.Random(1).randrange(3, 160) for _ in range(POSITIONS + 10)]
    out = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    with torch.no_grad():
        greedy = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                    min_new_tokens=12)
    assert out[0].outputs[0].token_ids == greedy[0, len(prompt):].tolist()


def test_info_shows_the_derived_context(scaled):
    directory, _, context = scaled
    assert model_info(str(directory), "float32")["context_length"] == context
