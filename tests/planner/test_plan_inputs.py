"""`inferlab plan`'s inputs: refused as the engine (and vLLM) refuse them, before this machine is
measured, and its lists as JSON under --json."""

from __future__ import annotations

import json

import pytest

from inferlab.cli import main
from inferlab.planner import cli as plan_cli


def test_a_step_budget_below_the_batch_is_refused_as_serve_refuses_it(capsys):
    """Once planned as if deployable (TTFT in steps of 16 tokens) while `inferlab serve` and
    vLLM's SchedulerConfig refuse max_num_batched_tokens < max_num_seqs with these words."""
    assert main(["plan", "Llama-3.1-8B", "--hardware", "H100-SXM", "--max-num-batched-tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert "max_num_batched_tokens (16) must be greater than or equal to max_num_seqs (256)" in err
    assert main(["plan", "Llama-3.1-8B", "--hardware", "H100-SXM", "--max-num-batched-tokens", "16",
                 "--max-num-seqs", "16", "--json"]) == 0  # equal is allowed


@pytest.mark.parametrize("argv", [
    ["nosuchmodel"],
    ["SmolLM2-135M", "--workload", "foo=1"],
    ["SmolLM2-135M", "--slo", "ttft=fast"],
    ["SmolLM2-135M", "--kv-cache-memory", "lots"],
    ["SmolLM2-135M", "--memory", "-1"],
    # the settings checked on the plan's inputs too (once after a 45 s measurement)
    ["SmolLM2-135M", "--block-size", "3"],
    ["SmolLM2-135M", "--kv-dtype", "foo"],
    ["SmolLM2-135M", "--max-num-seqs", "8", "--max-num-batched-tokens", "4"],
    ["SmolLM2-135M", "--gpu-memory-utilization", "2"],
    ["SmolLM2-135M", "--request-rate", "-1"],
    ["SmolLM2-135M", "--price-per-hour", "-1"],
    ["SmolLM2-135M", "--bandwidth-efficiency", "7"],
])
def test_bad_input_is_refused_before_this_machine_is_measured(tmp_path, capsys, monkeypatch, argv):
    """Once each of these first measured the CPU (~15 s) and wrote the cache, then gave its error."""
    def measured(*_args, **_kwargs):
        raise AssertionError("measured before the inputs were checked")

    monkeypatch.setattr(plan_cli, "load_or_measure", measured)
    cache = tmp_path / "cpu.json"
    assert main(["plan", *argv, "--hardware", "cpu-local", "--cache", str(cache)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not cache.exists()


def test_list_json_is_json_of_the_same_presets_and_hardware(capsys):
    assert main(["plan", "--list"]) == 0
    text = capsys.readouterr().out
    assert main(["plan", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "Llama-3.1-8B" in listed["models"] and "Llama-3.1-8B" in text
    names = [h["name"] for h in listed["hardware"]]
    assert {"H100-SXM", "L4", "cpu-local"} <= set(names)
    assert all(f"  {name} " in text for name in names)
    h100 = next(h for h in listed["hardware"] if h["name"] == "H100-SXM")
    assert 79 * 2**30 < h100["memory_bytes"] <= 80 * 2**30  # NVIDIA's 81,559 MiB of "80 GB"
