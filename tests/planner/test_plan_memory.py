"""Hand-computed memory figures from the models' public config.json (and the embedded GGUF)."""

from __future__ import annotations

import math

import pytest

from inferlab.errors import InferlabError
from inferlab.models.embedded import embedded_model_path
from inferlab.models.gguf_reader import GGUFFile
from inferlab.planner.budget import MemoryConfig, kv_heads_per_device, plan_memory
from inferlab.planner.hardware import datasheet_hardware
from inferlab.planner.memory import (
    kv_cache_bytes_per_token,
    num_kv_blocks,
    weight_bytes,
    weight_format,
)
from inferlab.planner.model_shapes import resolve_model

GiB = 2**30


def _plan(model: str | None, kv_dtype: str = "bf16", fmt: str = "bf16", **kw):
    spec = resolve_model(model)
    cfg = MemoryConfig(device_memory_bytes=kw.pop("memory", 80 * 10**9), kv_dtype=kv_dtype, **kw)
    return plan_memory(spec.config, weight_bytes(spec.config, weight_format(fmt)), cfg)


@pytest.mark.parametrize(("model", "kv_dtype", "expected"), [
    ("Llama-2-7B", "fp16", 524_288),  # 2 × 32 layers × 32 KV heads × 128 × 2 bytes
    ("Llama-3.1-8B", "bf16", 131_072),  # 2 × 32 × 8 × 128 × 2
    ("Llama-3.1-8B", "fp8", 65_536),  # 2 × 32 × 8 × 128 × 1
    (None, "bf16", 23_040),  # embedded SmolLM2-135M from its GGUF: 2 × 30 × 3 × 64 × 2
    ("Qwen3-32B", "bf16", 262_144),  # 2 × 64 × 8 × 128 × 2
])
def test_kv_bytes_per_token_hand_counts(model, kv_dtype, expected):
    assert _plan(model, kv_dtype).kv_bytes_per_token == expected


def test_engine_formula_signature_is_the_planners():
    # the engine calls these two directly; same figures as the hand counts above
    per_token = kv_cache_bytes_per_token(30, 3, 64, 2)
    assert per_token == 23_040
    assert num_kv_blocks(64 * 2**20, 16, per_token) == 182  # 67,108,864 // 368,640


# hand counts (see the derivations): bf16 = published parameter count × 2;
# int4-g128 = block linears × 4 bits + one bf16 scale per row per 128 input columns
# + embeddings, lm_head, norms in bf16
HAND_WEIGHT_BYTES = {
    # 6,738,415,616 params (Meta's model card: 6.7B)
    ("Llama-2-7B", "bf16"): 13_476_831_232,
    # linears 6,476,005,376 / 2 + 50,593,792 scales × 2 + 262,410,240 dense × 2
    ("Llama-2-7B", "int4-g128"): 3_864_010_752,
    # 8,030,261,248 params (Meta's model card: 8.0B)
    ("Llama-3.1-8B", "bf16"): 16_060_522_496,
    # linears 6,979,321,856 / 2 + 54,525,952 scales × 2 + 1,050,939,392 dense × 2 (untied lm_head)
    ("Llama-3.1-8B", "int4-g128"): 5_700_591_616,
    # 134,515,008 params (tied embeddings)
    (None, "bf16"): 269_030_016,
    # linears 106,168,320 / 2 + 1,658,880 scales × 2 (30 layers × (576 × 9 + 192 × 9 × 2 + 576 × 9
    # + 1,536 × 9 × 2 + 576 × 24): 576 inputs in 9 groups of 64, 1,536 in 24) + 28,346,688 × 2
    (None, "int4-g64"): 113_095_296,
}


@pytest.mark.parametrize(("model", "fmt"), list(HAND_WEIGHT_BYTES))
def test_weight_bytes_within_one_percent_of_hand_counts(model, fmt):
    spec = resolve_model(model)
    got = weight_bytes(spec.config, weight_format(fmt)).total_bytes
    hand = HAND_WEIGHT_BYTES[(model, fmt)]
    assert abs(got - hand) / hand < 0.01, (got, hand)


def test_groups_that_do_not_tile_the_inputs_are_refused():
    """Once planned with a partial last group (576 = 4.5 × 128), a checkpoint `inferlab
    quantize` refuses to write."""
    spec = resolve_model(None)
    with pytest.raises(InferlabError, match=r"int4-g128: group size 128 does not divide the "
                                            r"model's 576 inputs \(try int4-g64\)"):
        weight_bytes(spec.config, weight_format("int4-g128"))
    with pytest.raises(InferlabError, match=r"\(try int4-g64-asym\)"):
        weight_bytes(spec.config, weight_format("int4-g128-asym"))


def test_embedded_bf16_weights_match_the_gguf_tensor_count():
    # an independent reference: the elements of every tensor in the shipped file
    reader = GGUFFile(embedded_model_path())
    elements = sum(math.prod(t.shape) for t in reader.tensors)
    spec = resolve_model(None)
    assert weight_bytes(spec.config, weight_format("bf16")).total_bytes == 2 * elements


def test_weight_formats_order_by_size():
    cfg = resolve_model("Llama-3.1-8B").config
    sizes = [weight_bytes(cfg, weight_format(f)).total_bytes
             for f in ("fp32", "bf16", "int8", "int4-g32", "int4-g128")]
    assert sizes == sorted(sizes, reverse=True)
    # 8-bit linears with one scale per output row: about half of bf16 plus the dense part
    int8 = weight_bytes(cfg, weight_format("int8"))
    assert int8.packed_bytes == 6_979_321_856 and int8.num_scales == 32 * (4096 + 1024 + 1024 + 4096
                                                                           + 14336 * 2 + 4096)


def test_fixed_kv_budget_gives_the_engines_block_count():
    plan = _plan(None, kv_cache_bytes=64 * 2**20)
    assert plan.num_blocks == 182 and plan.kv_tokens == 182 * 16
    # sequences of 1,280 tokens take 80 blocks each
    assert plan.max_sequences(1280) == 2


def test_budget_left_for_kv_on_an_80gb_device():
    # Llama-3.1-8B bf16 on 80 GB at 0.9: 72e9 usable − 16,060,522,496 weights − activations
    # (8192 × (2×4096 + 3×14336) × 2 + 2 × 256 × 128256 × 4 = 838,860,800 + 262,668,288)
    # − 1 GiB overhead = 53,764,206,592 bytes -> // (16 × 131,072) = 25,636 blocks
    plan = _plan("Llama-3.1-8B", runtime_overhead_bytes=GiB, max_num_batched_tokens=8192)
    assert plan.activation_bytes == 1_101_529_088
    assert plan.kv_cache_bytes == 53_764_206_592
    assert plan.num_blocks == 25_636


def test_a_small_step_budget_samples_fewer_sequences():
    # SmolLM2-135M, 16 tokens a step: 16 × (2 × 576 + 3 × 1536) × 2 B of activations, and
    # logits for at most 16 sequences (one token each), not 256: 2 × 16 × 49,152 × 4 B
    plan = _plan(None, max_num_seqs=16, max_num_batched_tokens=16)
    assert plan.activation_bytes == 184_320 + 6_291_456


def test_tensor_parallel_splits_kv_heads_and_replicates_past_them():
    cfg = resolve_model("Llama-3.1-70B").config  # 64 heads, 8 KV heads
    assert kv_heads_per_device(cfg, 4) == 2
    assert kv_heads_per_device(cfg, 16) == 1  # each device keeps a copy of one KV head
    with pytest.raises(InferlabError, match="does not divide"):
        kv_heads_per_device(cfg, 3)
    tp4 = _plan("Llama-3.1-70B", tensor_parallel=4)
    assert tp4.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2


def test_tensor_parallel_past_the_kv_heads_replicates_their_k_v_projections():
    """Once every weight was divided by tp: at tp 16 with 8 KV heads each device holds one whole
    KV head (two devices a head), so its k_proj and v_proj rows, not half a head's."""
    # Llama-3.1-8B in bf16: 8,030,261,248 params × 2 B = 16,060,522,496 B, of which k_proj and
    # v_proj are 32 layers × 2 × 4,096 × (8 × 128) × 2 B = 536,870,912 B. Per device:
    # (16,060,522,496 − 536,870,912) / 16 + 536,870,912 / 8 KV heads (one head's) = 1,037,337,088 B
    # (989.28 MiB), not 16,060,522,496 / 16 = 1,003,782,656 B
    assert _plan("Llama-3.1-8B", tensor_parallel=16).weight_bytes == 1_037_337_088
    assert weight_bytes(resolve_model("Llama-3.1-8B").config, weight_format("bf16")).kv_proj_bytes \
        == 536_870_912
    # fp8, scales included: k/v are 268,435,456 B of 8-bit weights + 32 × 2 × 1,024 row scales
    # × 2 B = 268,566,528 B of 6,979,321,856 + 1,376,256 scales × 2 + 1,050,939,392 × 2 =
    # 9,083,953,152 B; (9,083,953,152 − 268,566,528) / 16 + 268,566,528 / 8 = 584,532,480 B
    assert _plan("Llama-3.1-8B", fmt="fp8", tensor_parallel=16).weight_bytes == 584_532_480
    # up to the KV heads nothing is replicated: 16,060,522,496 / 8
    assert _plan("Llama-3.1-8B", tensor_parallel=8).weight_bytes == 2_007_565_312


def test_a_model_that_does_not_fit_says_so_in_one_line():
    with pytest.raises(InferlabError) as e:
        _plan("Llama-3.1-70B", memory=24 * 10**9)
    message = str(e.value)
    assert "does not fit" in message and "\n" not in message and "--tensor-parallel" in message


# memory.total as nvidia-smi prints it (MiB) on these GPUs, cudaMemGetInfo's total: what a server
# multiplies by --gpu-memory-utilization, not the datasheet's decimal GB (H200 "141 GB"); the
# MI300X's is rocm-smi's "VRAM Total Memory (B): 205822885888"
REPORTED_MIB = {"H100-SXM": 81559, "H100-PCIe": 81559, "H200": 143771, "A100-80GB": 81920,
                "A100-40GB": 40960, "L4": 23034, "A10": 23028, "A10G": 23028, "B200": 183359,
                "RTX-4090": 24564, "MI300X": 205822885888 // 2**20}


@pytest.mark.parametrize(("name", "mib"), list(REPORTED_MIB.items()))
def test_presets_carry_the_memory_the_device_reports(name, mib):
    """Once 141e9 B for an H200 (131.3 GiB): its KV cache planned ~9 GiB short."""
    assert datasheet_hardware(name).memory_bytes == mib * 2**20


def test_h200_kv_budget_from_the_reported_total():
    # Llama-3.1-8B bf16: int(143,771 MiB × 0.9) = 135,679,338,086 usable − 16,060,522,496 weights
    # − activations (768 × (2×4096 + 3×14336) × 2 + 2 × 256 × 128,256 × 4 = 341,311,488)
    # − 1 GiB overhead = 118,203,762,278 B -> // (16 × 131,072) = 56,363 blocks
    hw = datasheet_hardware("H200")
    plan = _plan("Llama-3.1-8B", memory=hw.memory_bytes, runtime_overhead_bytes=GiB,
                 max_num_batched_tokens=768)
    assert plan.kv_cache_bytes == 118_203_762_278
    assert plan.num_blocks == 56_363


def test_a_fixed_kv_budget_below_one_block_asks_for_a_larger_budget():
    """Once advised a larger --tensor-parallel or other hardware, which a fixed budget ignores."""
    with pytest.raises(InferlabError) as e:
        _plan("Llama-3.1-8B", kv_cache_bytes=2**20)  # one block: 16 × 131,072 B = 2 MiB
    message = str(e.value)
    assert "--kv-cache-memory" in message and "less than one KV block (2.00 MiB" in message
    assert "--tensor-parallel" not in message


@pytest.mark.parametrize(("name", "context"), [
    ("Mistral-7B", 32768),  # v0.3: max_position_embeddings 32768, sliding_window null
    ("Qwen2.5-7B", 32768), ("Llama-3.2-3B", 131072)])
def test_presets_hold_their_models_whole_context(name, context):
    assert resolve_model(name).config.max_context == context
