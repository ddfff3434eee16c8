"""The planner's bytes for a GGUF file where the engine holds its weights as their blocks'
codes (fp32 through the AVX2 linears): by hand on a small config, and against the bytes the
engine itself holds for the embedded model."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
import torch

from inferlab.cli import main
from inferlab.kernels import cpu_ops
from inferlab.models.config import ModelConfig
from inferlab.models.embedded import embedded_model_path
from inferlab.planner.gguf_held import held_format
from inferlab.planner.measure import cpu_name
from inferlab.planner.memory import WeightFormat, weight_bytes
from inferlab.planner.model_shapes import resolve_model
from tests.planner.test_plan_cli import FIGURES

# hidden 64, MLP 128, 2 heads / 1 KV head of 32: q 64 x 64, k and v 32 x 64, o 64 x 64, gate
# and up 128 x 64, down 64 x 128; vocab 256 tied
SMALL = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64, intermediate_size=128,
                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32, max_position_embeddings=64,
                    tie_word_embeddings=True)


def _format(types: dict[str, str]) -> WeightFormat:
    return WeightFormat("gguf", 32, None, False, "fp32", dense_dtype="fp32", gguf_types=tuple(types.items()))


def _layer(kind: str) -> str:
    return f"model.layers.0.{kind}.weight"


def test_small_model_by_hand():
    types = {_layer("self_attn.q_proj"): "Q4_1", _layer("self_attn.k_proj"): "Q4_1",
             _layer("self_attn.v_proj"): "Q8_0",  # q/k/v mixed: the fused layer stays fp32
             _layer("self_attn.o_proj"): "Q8_0",
             _layer("mlp.gate_proj"): "Q4_0", _layer("mlp.up_proj"): "Q4_0",
             _layer("mlp.down_proj"): "BF16",
             "model.embed_tokens.weight": "Q8_0"}
    w = weight_bytes(SMALL, _format(types))
    # q, k, v fp32: (64 + 32 + 32) x 64 x 4 = 32,768 B; down bf16: 64 x 128 x 2 = 16,384 B
    # o Q8_0: 4,096 codes + 4,096 / 32 = 128 scales x 4 B; gate, up Q4_0: 16,384 weights as
    # 8,192 B of codes, 512 scales and 512 offsets x 4 B; head Q8_0: 16,384 codes + 512 scales;
    # norms: 3 x 64 fp32
    assert w.packed_bytes == 4_096 + 8_192 + 16_384
    assert w.num_scales == 128 + 512 + 512 and w.scale_bytes == 4 * 1_152
    assert w.zero_point_bytes == 4 * 512  # the 4-bit codes' fp32 offsets
    assert w.dense_bytes == 32_768 + 16_384 + 4 * 192
    assert w.total_bytes == 28_672 + 4_608 + 2_048 + 49_920
    assert w.kv_proj_bytes == 2 * 32 * 64 * 4  # k and v, fp32 with their fused layer
    assert dict((how, (params, nbytes)) for how, params, nbytes in w.held) == {
        "Q8_0": (4_096 + 16_384, 4_096 + 512 + 16_384 + 2_048), "Q4_0": (16_384, 8_192 + 4_096),
        "bf16": (8_192, 16_384), "fp32": (8_192 + 192, 32_768 + 768)}


def test_an_untied_head_and_its_table():
    """An untied embedding table stays fp32 (rows gathered); its head holds its own codes; rows
    not a multiple of 8 are held up to one."""
    cfg = dataclasses.replace(SMALL, tie_word_embeddings=False, vocab_size=250)
    w = weight_bytes(cfg, _format({"lm_head.weight": "Q4_1", "model.embed_tokens.weight": "Q4_1"}))
    head = (256 * 64 // 2, 256 * 2, 256 * 2 * 4)  # 250 rows held as 256: codes, scales, offsets
    assert (w.packed_bytes, w.num_scales, w.zero_point_bytes) == head
    linears = 64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 2 + 64 * 128
    assert w.dense_bytes == 4 * (linears + 250 * 64 + 192)


@pytest.mark.skipif(held_format(embedded_model_path(), "fp32") is None or not cpu_ops.avx2_quant_linear_available(),
                    reason="the engine holds GGUF codes only where it runs fp32 through the AVX2 linears")
def test_the_embedded_model_as_the_engine_holds_it():
    """The planner's bytes are those of the engine's tensors (the RoPE tables apart: no weights)."""
    from inferlab.kernels.linear_choice import use_engine_linears
    from inferlab.models.loader import load_model

    model = load_model(None, torch.float32).model
    use_engine_linears(model, torch.device("cpu"), torch.float32)
    tensors = {}
    for name, t in itertools.chain(model.named_parameters(remove_duplicate=False),
                                   model.named_buffers(remove_duplicate=False)):
        if t is not None and "rotary" not in name:
            tensors[t.data_ptr(), t.nbytes] = t  # a tied table counted once
    spec = resolve_model(None)
    planned = weight_bytes(spec.config, held_format(spec.source, "fp32"))
    assert planned.total_bytes == sum(nbytes for _, nbytes in tensors)
    assert planned.total_bytes < 0.25 * 4 * planned.total_params  # Q4_1 and Q8_0, not fp32


def test_plan_takes_it_where_the_engine_holds_codes(capsys, tmp_path, monkeypatch):
    """`inferlab plan` on the embedded model: the GGUF's codes on an AVX2 CPU without fast
    bf16, fp32 on one without AVX2, bf16 with AVX512-BF16."""
    cache = tmp_path / "cpu-local.json"
    codes = {"1": {"512": 5e9, "4096": 5e9}, "16": {"512": 1e9}}  # the dense grid: 25 GB/s
    cache.write_text(json.dumps(FIGURES | {"cpu": cpu_name(), "codes_stream_bytes_per_s": codes}))
    formats = {}
    for flags in ({"avx2", "fma"}, {"sse4_2"}, {"avx2", "fma", "avx512_bf16"}):
        monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda flags=flags: frozenset(flags))
        assert main(["plan", "--cache", str(cache), "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        formats[" ".join(sorted(flags))] = (plan["weights"]["format"], plan["weights"]["total_bytes"] // 2**20)
    assert formats == {"avx2 fma": ("gguf", 106), "sse4_2": ("fp32", 513), "avx2 avx512_bf16 fma": ("bf16", 256)}
    # the codes at their own rate, the KV cache (1,153 tokens x 46,080 B) at the dense layers'
    monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert main(["plan", "--cache", str(cache)]) == 0
    assert ("memory-bound: 112 MB of weights / (5 GB/s at width 576, 1 row × 1) + 53.1 MB of KV cache "
            "/ (25 GB/s × 1)") in capsys.readouterr().out


def test_info_gives_the_bytes_fp32_serving_holds(capsys, monkeypatch):
    """`inferlab info --dtype float32`: the embedded model as the engine holds it in fp32 on an
    AVX2 CPU (test_the_embedded_model_as_the_engine_holds_it: 111,617,280 B), all fp32 elsewhere."""
    seen = {}
    for flags in ({"avx2", "fma"}, {"sse4_2"}):
        monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda flags=flags: frozenset(flags))
        assert main(["info", "--dtype", "float32", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        seen[" ".join(sorted(flags))] = (info["weight_bytes"], info["quantization"][0].rpartition(" (")[2])
    assert seen == {"avx2 fma": (111_617_280, "linears held as their Q4_1, Q8_0 codes)"),
                    "sse4_2": (4 * 134_515_008, "dequantized at load)")}
