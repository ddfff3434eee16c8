"""Capacity follows the workload's sequences, and names what really stops the batch growing."""

from __future__ import annotations

import json

import pytest

from inferlab.cli import main
from inferlab.errors import InferlabError
from inferlab.planner.budget import MemoryConfig
from inferlab.planner.capacity import SLO, Workload
from inferlab.planner.hardware import Hardware, datasheet_hardware
from inferlab.planner.memory import weight_format
from inferlab.planner.model_shapes import resolve_model
from inferlab.planner.plan import PlanInputs, build_plan

H100 = datasheet_hardware("H100-SXM")


def _plan(model: str | None = "Llama-3.1-8B", hw: Hardware = H100, workload: Workload = Workload(),
          step_tokens: int = 768, max_num_seqs: int = 256, context_len: int | None = None):
    memory = MemoryConfig(hw.memory_bytes, runtime_overhead_bytes=hw.runtime_overhead_bytes,
                          max_num_batched_tokens=step_tokens, max_num_seqs=max_num_seqs)
    return build_plan(PlanInputs(resolve_model(model), hw, weight_format("bf16"), memory, workload,
                                 SLO(), request_rate=10, price_per_gpu_hour=2, context_len=context_len))


def test_context_len_changes_only_the_concurrency_figure():
    """Once --context-len 131072 planned batch 3 and 6 devices for 1,280-token requests: a
    server admits a request by its own length, whatever the longest it could take."""
    short, long = _plan(), _plan(context_len=131072)
    assert long.capacity == short.capacity and long.max_batch == short.max_batch
    assert long.capacity.gpus == 1
    # the concurrency figure: a 131,072-token sequence holds 131,072 / 16 = 8,192 blocks
    memory = long.to_dict()["memory"]
    assert memory["context_len"] == 131072
    assert memory["max_sequences"] == long.memory.num_blocks // 8192


def test_the_workloads_length_is_checked_against_the_model():
    """Once planned in full: --context-len 1000 hid a 200,010-token workload from the check."""
    with pytest.raises(InferlabError, match=r"200010 tokens \(the workload's prompt \+ output\) "
                                            r"exceeds Llama-3.1-8B's maximum of 131072"):
        _plan(workload=Workload(200_000, 10), context_len=1000)
    with pytest.raises(InferlabError, match=r"\(--context-len\) exceeds"):
        _plan(context_len=131073)


def test_a_step_token_budget_that_caps_the_rate_is_named():
    """Once 'limited by memory' though the memory held more sequences than the chosen batch."""
    capped = _plan(workload=Workload(4096, 128))  # steps of 768 keep 768 × 128 / 4,224 = 23 up
    assert capped.capacity.best.batch == capped.max_batch == 23
    assert capped.capacity.limited_by == "max_num_batched_tokens"
    # the constraint named is the one that binds: a larger step lets the batch reach memory's
    # limit (107 sequences, whose steps need 107 + 107 × 4,096 / 128 = 3,531 tokens: 4,096 hold
    # them, 2,048 hold 62)
    relieved = _plan(workload=Workload(4096, 128), step_tokens=4096)
    assert relieved.capacity.best.batch == relieved.max_batch
    assert relieved.capacity.limited_by == "memory"
    assert relieved.capacity.best.requests_per_s > capped.capacity.best.requests_per_s


def test_a_rate_that_peaks_below_the_limit_names_the_step_time():
    """Once 'limited by max_num_seqs' (16) for batch 5: on this grid a 16-row step streams
    weights at an eighth of a 1-row step's rate, so tokens/s falls past batch 5 (27, 39, 48 at
    batches 1, 2, 4, then 46 at 8)."""
    grid = Hardware("grid", 24 * 2**30, 8e9, {"bf16": 4e11}, 8e9, "test", runtime_overhead_bytes=0,
                    bandwidth_efficiency=1.0, compute_efficiency=1.0,
                    stream_rates={1: {512: 8e9}, 16: {512: 1e9}})
    plan = _plan(None, grid, max_num_seqs=16)
    assert plan.max_batch == 16 and plan.capacity.best.batch == 5
    assert plan.capacity.limited_by == "step time"


def test_few_output_tokens_per_second_are_not_printed_as_zero(capsys):
    """Once '0 output tokens/s' for long prompts served at a fraction of a request a second."""
    argv = ["plan", "Llama-3.1-8B", "--hardware", "H100-SXM", "--workload", "prompt=100000,output=2"]
    assert main([*argv, "--json"]) == 0
    rate = json.loads(capsys.readouterr().out)["capacity"]["output_tokens_per_s_per_replica"]
    assert 0 < rate < 0.5
    assert main(argv) == 0
    assert f"{rate:.3g} output tokens/s" in capsys.readouterr().out


def test_fractional_tokens_are_refused():
    """Once prompt=1024.9 was planned as 1,024 tokens."""
    with pytest.raises(InferlabError, match=r"prompt=1024.9 is not a whole number of tokens"):
        Workload.parse("prompt=1024.9,output=10")
    assert Workload.parse("prompt=1e3,output=16") == Workload(1000, 16)
