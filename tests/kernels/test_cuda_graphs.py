"""CUDA-graph helper: bucketing and padding on CPU; capture and replay where a GPU exists."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from inferlab.engine.model_runner import ModelRunner, RunnerConfig
from inferlab.errors import InferlabError
from inferlab.kernels.cuda_graphs import (
    CudaGraphConfig,
    DecodeGraphs,
    default_capture_sizes,
    padded_batch_size,
)
from inferlab.models.config import ModelConfig
from inferlab.models.llama import LlamaForCausalLM


def test_default_sizes_are_small_powers_then_multiples_of_eight() -> None:
    assert default_capture_sizes(1) == (1,)
    assert default_capture_sizes(6) == (1, 2, 4, 6)
    assert default_capture_sizes(40) == (1, 2, 4, 8, 16, 24, 32, 40)
    assert default_capture_sizes(20) == (1, 2, 4, 8, 16, 20)


@pytest.mark.parametrize(("batch", "padded"), [(1, 1), (3, 4), (8, 8), (9, 16), (17, 20),
                                               (21, None)])
def test_padded_batch_size_picks_the_next_capture_size(batch: int, padded: int | None) -> None:
    assert padded_batch_size(batch, (1, 2, 4, 8, 16, 20)) == padded


def test_config_rejects_bad_sizes() -> None:
    with pytest.raises(InferlabError, match="capture sizes"):
        CudaGraphConfig(max_batch_size=8, capture_sizes=(4, 16))
    with pytest.raises(InferlabError, match="max batch size"):
        CudaGraphConfig(max_batch_size=0)
    assert CudaGraphConfig(max_batch_size=8, capture_sizes=(4, 2, 4)).sizes() == (2, 4)


class RecordingStep:
    """A row-wise decode step: out[b] = ids[b] * 10 + sum of block_table row b."""

    def __init__(self) -> None:
        self.seen: list[dict[str, torch.Tensor]] = []

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.seen.append({k: v.clone() for k, v in inputs.items()})
        return inputs["ids"] * 10 + inputs["tables"].sum(1)


def make_graphs(step: RecordingStep) -> DecodeGraphs:
    config = CudaGraphConfig(max_batch_size=8, capture_sizes=(2, 4, 8))
    example = {"ids": torch.zeros(8, dtype=torch.int64),
               "slots": torch.zeros(8, dtype=torch.int64),
               "tables": torch.zeros(8, 5, dtype=torch.int32)}
    return DecodeGraphs(step, example, {"ids": 0, "slots": -1, "tables": 0}, config)


def test_run_pads_to_the_capture_size_and_returns_only_real_rows() -> None:
    step = RecordingStep()
    graphs = make_graphs(step)
    assert not graphs.use_graphs  # CPU: the same buffers and padding, run eagerly
    graphs.capture()  # a no-op without CUDA
    ids = torch.tensor([3, 1, 4])
    tables = torch.tensor([[1, 2], [3, 0], [5, 6]], dtype=torch.int32)  # narrower than buffers
    out = graphs.run({"ids": ids, "slots": torch.tensor([7, 8, 9]), "tables": tables})
    assert out.tolist() == [33, 13, 51]
    seen = step.seen[-1]
    assert seen["ids"].tolist() == [3, 1, 4, 0]
    assert seen["slots"].tolist() == [7, 8, 9, -1]  # the padded row writes no KV
    assert seen["tables"][:3, :2].tolist() == tables.tolist() and seen["tables"][3].sum() == 0


def test_padding_is_refreshed_between_batches() -> None:
    """A row that was real in a bigger batch is padding again in a smaller one."""
    step = RecordingStep()
    graphs = make_graphs(step)
    graphs.run({"ids": torch.arange(1, 8), "slots": torch.arange(7),
                "tables": torch.ones(7, 5, dtype=torch.int32)})
    out = graphs.run({"ids": torch.tensor([2, 2, 2]), "slots": torch.tensor([0, 1, 2]),
                      "tables": torch.ones(3, 5, dtype=torch.int32)})
    assert out.tolist() == [25, 25, 25]
    assert step.seen[-1]["slots"].tolist() == [0, 1, 2, -1]


def test_rejects_mismatched_inputs() -> None:
    graphs = make_graphs(RecordingStep())
    with pytest.raises(ValueError, match="'slots'"):
        graphs.run({"ids": torch.zeros(3, dtype=torch.int64), "slots": torch.zeros(2),
                    "tables": torch.zeros(3, 5, dtype=torch.int32)})
    with pytest.raises(InferlabError, match="CUDA device"):
        DecodeGraphs(RecordingStep(), {"ids": torch.zeros(8)}, {"ids": 0},
                     CudaGraphConfig(max_batch_size=8), use_graphs=True)


def test_a_dropped_graph_runner_is_freed_by_reference_counting_alone() -> None:
    """LLMEngine gc.freeze()s what exists when it is built, so the collector never frees a
    dropped engine's cycles: a runner whose graphs refer back to it would keep its KV cache
    (and on a GPU, the graphs' memory) for the rest of the process."""
    cfg = ModelConfig(architecture="LlamaForCausalLM", vocab_size=64, hidden_size=32,
                      intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).eval()
    gc.collect()
    gc.disable()
    try:
        runner = ModelRunner(model, RunnerConfig(num_blocks=8, block_size=16,
                                                 kv_dtype=torch.float32,
                                                 device=torch.device("cpu"),
                                                 max_graph_batch_size=4, max_model_len=64))
        assert runner.graphed is not None  # the graph path is built (its capture a CPU no-op)
        refs = [weakref.ref(x) for x in (runner, runner.graphed, runner.graphed.graphs,
                                         runner.kv_caches[0][0])]
        del runner
        assert [r() is None for r in refs] == [True] * len(refs)
    finally:
        gc.enable()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_replayed_graph_matches_eager_paged_attention() -> None:
    pytest.importorskip("triton")
    from inferlab.kernels.attention.metadata import AttentionMetadata
    from inferlab.kernels.attention.triton_paged import paged_attention

    dev = torch.device("cuda")
    block_size, hkv, hq, d, max_b = 16, 2, 8, 64, 8
    k_cache = torch.randn(64, block_size, hkv, d, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    arange = torch.arange(max_b + 1, dtype=torch.int32, device=dev)

    def step(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        b = inputs["q"].shape[0]
        meta = AttentionMetadata(arange[:b + 1], inputs["seq_lens"], inputs["tables"],
                                 inputs["slots"], [1] * b, [1] * b, block_size)
        return paged_attention(inputs["q"], inputs["k"], inputs["k"], k_cache, v_cache, meta,
                               d ** -0.5)

    example = {"q": torch.zeros(max_b, hq, d, device=dev, dtype=torch.bfloat16),
               "k": torch.zeros(max_b, hkv, d, device=dev, dtype=torch.bfloat16),
               "seq_lens": torch.ones(max_b, dtype=torch.int32, device=dev),
               "tables": torch.zeros(max_b, 4, dtype=torch.int32, device=dev),
               "slots": torch.zeros(max_b, dtype=torch.int64, device=dev)}
    pads = {"q": 0, "k": 0, "seq_lens": 1, "tables": 0, "slots": -1}
    graphs = DecodeGraphs(step, example, pads, CudaGraphConfig(max_batch_size=max_b))
    graphs.capture()
    for b in (1, 3, 8):
        q = torch.randn(b, hq, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, d, device=dev, dtype=torch.bfloat16)
        seq_lens = torch.randint(1, 60, (b,), dtype=torch.int32, device=dev)
        tables = torch.randperm(64, device=dev)[:4 * b].view(b, 4).to(torch.int32)
        slots = (tables[torch.arange(b), (seq_lens - 1) // block_size].long() * block_size
                 + (seq_lens - 1) % block_size)
        inputs = {"q": q, "k": k, "seq_lens": seq_lens, "tables": tables, "slots": slots}
        replayed = graphs.run(inputs).clone()
        # the padded batch may split the KV range differently: equal up to bf16 rounding
        torch.testing.assert_close(replayed, step(inputs), atol=2e-2, rtol=2e-2)
