"""`inferlab plan` end to end through the real CLI entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from inferlab.cli import main, parse_command_line
from inferlab.engine.args import engine_config_from_args
from inferlab.planner.measure import MEASUREMENT_VERSION, cpu_name

# what `--measure` writes, with round figures, so these tests need no micro-benchmark
FIGURES = {"cpu": "", "measurement_version": MEASUREMENT_VERSION, "threads": 2, "torch": "test",
           "memory_bandwidth_bytes_per_s": 25e9,
           "stream_bytes_per_s": {"1": {"512": 25e9, "4096": 25e9}, "16": {"512": 25e9}},
           "peak_flops": {"bf16": 1.5e12, "fp32": 3e11}, "layer_overhead_s": 100e-6, "memory_bytes": 24 * 2**30,
           "measured_at": "2026-01-01T00:00:00+00:00"}


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "cpu-local.json"
    path.write_text(json.dumps(FIGURES | {"cpu": cpu_name()}))
    return path


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU whose engine runs bf16 (--dtype auto), as the hand-computed figures below assume;
    test_cpu_local_plans_the_dtype_the_engine_runs_here covers one without."""
    monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda: frozenset({"avx512_bf16"}))


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_is_the_embedded_model_on_cpu_local(capsys, cache, bf16_cpu):
    code, out, _ = _run(capsys, "--cache", str(cache), "--json")
    plan = json.loads(out)
    assert code == 0
    assert plan["model"]["name"].startswith("SmolLM2-135M")
    assert plan["hardware"]["name"] == "cpu-local" and plan["hardware"]["measured"]
    assert plan["memory"]["kv_bytes_per_token"] == 23_040
    # weights 269,030,016 B (tied: all read) + KV of 1,153 tokens (1,024 prompt + 128 output on
    # average + the new one) × 23,040 B = 295,595,136 B at 25 GB/s = 11.824 ms, plus the
    # launch overhead of 30 layers × 100 µs = 3 ms
    assert plan["decode_batch1"]["time_ms"] == pytest.approx(11.8238 + 3.0, abs=1e-3)


def test_cpu_local_plans_the_engines_cpu_kv_cache(capsys, cache, bf16_cpu):
    """Once 0.9 × the machine's memory (~20 GiB, 739 sequences), not the engine's CPU default."""
    code, out, _ = _run(capsys, "--cache", str(cache), "--json")
    memory = json.loads(out)["memory"]
    assert code == 0
    # the engine's 2 GiB CPU default // (16 tokens × 23,040 B) = 5,825 blocks; sequences of
    # 1,280 tokens take 80 blocks each: 72
    assert memory["kv_cache_bytes"] == 2 * 2**30
    assert memory["num_blocks"] == 5_825 and memory["max_batch"] == 72
    code, out, _ = _run(capsys, "--cache", str(cache))
    assert "the engine's default on cpu-local" in out and "batch 72 (limited by memory)" in out
    code, out, _ = _run(capsys, "--cache", str(cache), "--kv-cache-memory", "64MiB", "--json")
    assert json.loads(out)["memory"]["num_blocks"] == 182  # 67,108,864 // 368,640


def test_a_block_larger_than_the_room_left_is_named_as_the_cause(capsys):
    """Once "try a larger --tensor-parallel, a smaller --weight-format ...", where the block size
    alone was too large: 1,048,576 tokens × 23,040 B = 22.5 GiB a block, 18.89 GiB left on an L4."""
    code, out, err = _run(capsys, "--hardware", "L4", "--block-size", "1048576")
    assert code == 2 and out == ""
    assert "less than one KV block (22.50 GiB)" in err and "try a smaller --block-size (16 tokens: 360.00 KiB a block)" in err


def test_a_sequence_of_one_block_is_said_so(capsys, cache):
    code, out, _ = _run(capsys, "--cache", str(cache), "--block-size", "2048")
    assert code == 0 and "(1 block each) at once" in out  # once "(1 blocks each)"


def test_the_default_step_is_the_servers(capsys, cache, bf16_cpu):
    """A plan is for serving: `inferlab serve`'s max_num_batched_tokens (768) sets the
    activation peak and the prefill's chunks, not the offline commands' 2048."""
    serve = engine_config_from_args(parse_command_line(["serve"])).max_num_batched_tokens
    code, out, _ = _run(capsys, "--cache", str(cache))
    assert code == 0 and serve == 768
    # 1,024 prompt tokens: a chunk of 768, then 256
    assert f"{serve} tokens × (2 × 576 + 3 × 1536) × 2 B" in out
    assert f"in 2 steps of up to {serve} (max_num_batched_tokens)" in out


def test_console_report_shows_factors(capsys, cache):
    code, out, _ = _run(capsys, "Llama-3.1-8B", "--hardware", "h100-sxm", "--slo", "itl_ms=30",
                        "--request-rate", "20", "--price-per-hour", "2.5")
    assert code == 0
    assert "131,072 B   2 × 32 layers × 8 KV heads × 128 head dim × 2 B" in out
    assert "replica(s)" in out and "per million output tokens" in out


@pytest.mark.parametrize(("argv", "expected"), [
    (["Lama-3.1-8B", "--hardware", "h100-sxm"], "did you mean Llama-3.1-8B"),
    (["Llama-3.1-8B", "--hardware", "H100-SMX"], "did you mean H100-SXM"),
    (["Llama-3.1-8B", "--hardware", "a100", "--memory", "0GB"], "did you mean A100-40GB"),
    (["Llama-3.1-8B", "--hardware", "A100-80GB", "--memory", "0GB"], "--memory must be at least 1 byte"),
    # once "must be positive, got '0.5'", which did not say how a size is read
    (["Llama-3.1-8B", "--hardware", "A100-80GB", "--memory=0.5"],
     "--memory: a size in bytes must be a whole number, got '0.5' (a number without a unit is "
     "bytes: give a size such as 24GiB)"),
    (["--hardware", "L4", "--kv-cache-memory", "0"], "--kv-cache-memory must be at least 1 byte"),
    # once planned: the engine has no tensor parallelism, and `inferlab quantize` refuses groups
    # that do not tile SmolLM2's 576 inputs
    (["--hardware", "cpu-local", "-tp", "3"], "--tensor-parallel 3: inferlab's engine runs cpu-local"),
    (["--hardware", "L4", "--weight-format", "int4-g128"],
     "group size 128 does not divide the model's 576 inputs (try int4-g64)"),
    (["Llama-3.1-8B", "--hardware", "A100-80GB", "--gpu-memory-utilization", "0"],
     "--gpu-memory-utilization must be in (0, 1]"),
    (["Llama-3.1-8B", "--hardware", "A100-80GB", "--weight-format", "int4g128"], "did you mean int4-g128"),
    (["Llama-3.1-8B", "--hardware", "A100-80GB", "--kv-dtype", "bf61"], "did you mean bf16"),
    (["Llama-3.1-70B", "--hardware", "L4"], "does not fit"),
    (["Llama-3.1-8B", "--hardware", "L4", "--memory", "lots"], "cannot read 'lots' as a size"),
    # once a ValueError / OverflowError traceback, or taken and printed as nan
    (["Llama-3.1-8B", "--hardware", "L4", "--workload", "prompt=nan,output=10"],
     "bad --workload value for prompt: 'nan' (expected a finite number)"),
    (["Llama-3.1-8B", "--hardware", "L4", "--workload", "prompt=inf,output=10"],
     "bad --workload value for prompt: 'inf' (expected a finite number)"),
    (["Llama-3.1-8B", "--hardware", "L4", "--workload", "prompt=lots,output=10"],
     "bad --workload value for prompt: 'lots' (expected a finite number)"),
    (["Llama-3.1-8B", "--hardware", "L4", "--slo", "ttft_ms=nan"],
     "bad --slo value for ttft_ms: 'nan' (expected a finite number)"),
    # key=value lists read as --data's and --header's do; a key given twice was once planned
    # with its second value
    (["Llama-3.1-8B", "--hardware", "L4", "--workload", "prompt=64,prompt=128"],
     "bad --workload item 'prompt=128': prompt is given twice"),
    (["Llama-3.1-8B", "--hardware", "L4", "--workload", "promt=64"],
     "bad --workload item 'promt=64': expected prompt=N,output=N"),
    (["Llama-3.1-8B", "--hardware", "L4", "--slo", "ttft_ms"],
     "bad --slo item 'ttft_ms': expected ttft_ms=N,itl_ms=N"),
    # once planned, though the engine refuses the block size, or the default workload taken
    (["Llama-3.1-8B", "--hardware", "L4", "--block-size", "7"], "block_size must be a power of two"),
    (["Llama-3.1-8B", "--hardware", "L4", "--workload", ""], "--workload is empty"),
    (["Llama-3.1-8B", "--hardware", "L4", "--request-rate", "inf"], "positive and finite"),
    (["Llama-3.1-8B", "--hardware", "L4", "--request-rate", "nan"], "positive and finite"),
    (["Llama-3.1-8B", "--hardware", "L4", "--price-per-hour", "nan"], "positive and finite"),
    # once the whole plan printed first, then the error
    (["Llama-3.1-8B", "--hardware", "L4", "--html", "/nonexistent/plan.html"],
     "--html /nonexistent/plan.html: folder /nonexistent does not exist"),
])
def test_bad_input_is_one_line_with_exit_code_2(capsys, argv, expected):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert expected in err


def test_list_names_presets_and_hardware(capsys):
    code, out, _ = _run(capsys, "--list")
    assert code == 0
    for name in ("Llama-3.1-70B", "Qwen3-32B", "H200", "MI300X", "cpu-local"):
        assert name in out


def test_model_directory_and_gguf_file(capsys, tmp_path, cache):
    # a Hugging Face config.json of Llama-2-7B's shape, read from a directory
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "vocab_size": 32000, "max_position_embeddings": 4096}
    (tmp_path / "llama2").mkdir()
    (tmp_path / "llama2" / "config.json").write_text(json.dumps(config))
    code, out, _ = _run(capsys, str(tmp_path / "llama2"), "--hardware", "h100-sxm",
                        "--kv-dtype", "fp16", "--json")
    assert code == 0 and json.loads(out)["memory"]["kv_bytes_per_token"] == 524_288


def test_an_unset_kv_dtype_follows_the_weights(capsys):
    """Once bf16 KV (23,040 B a token, 182 blocks) beside fp32 weights, where the engine
    (LLM(dtype="float32")) and vLLM's kv_cache_dtype auto keep it in fp32: 2 × 30 layers
    × 3 KV heads × 64 × 4 B = 46,080 B, and 67,108,864 // (16 × 46,080) = 91 blocks."""
    def kv(*argv: str) -> tuple[int, int]:
        code, out, _ = _run(capsys, "--hardware", "L4", "--kv-cache-memory", "64MiB", "--json", *argv)
        memory = json.loads(out)["memory"]
        return memory["kv_bytes_per_token"], memory["num_blocks"]

    assert kv("--weight-format", "fp32") == (46_080, 91)
    assert kv("--weight-format", "fp16") == kv() == (23_040, 182)
    assert kv("--weight-format", "fp32", "--kv-dtype", "bf16") == (23_040, 182)


def test_cpu_local_plans_the_dtype_the_engine_runs_here(capsys, cache, monkeypatch):
    """On a CPU without AMX or AVX512-BF16 the engine's --dtype auto is fp32 (46,080 B of KV a
    token: 2 GiB // (16 × 46,080) = 2,912 blocks); the plan once assumed bf16 there (5,825)."""
    def plan(*argv: str) -> tuple[int, dict]:
        code, out, _ = _run(capsys, "--cache", str(cache), "--json", *argv)
        return code, json.loads(out) if out else {}

    monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda: frozenset({"avx512f"}))
    code, fp32 = plan()
    assert code == 0 and fp32["weights"]["format"] == "fp32"
    assert (fp32["memory"]["kv_bytes_per_token"], fp32["memory"]["num_blocks"]) == (46_080, 2_912)
    monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda: frozenset({"avx512_bf16"}))
    code, bf16 = plan()
    assert (bf16["memory"]["kv_bytes_per_token"], bf16["memory"]["num_blocks"]) == (23_040, 5_825)


def test_cpu_local_quantized_formats_keep_their_dense_layers_in_the_engines_dtype(capsys, cache, monkeypatch):
    """Their embeddings, norms and KV cache are fp32 where --dtype auto is (they stayed bf16:
    twice the blocks, and --kv-dtype fp32 was refused as 'not the weights' bf16')."""
    monkeypatch.setattr("inferlab.engine.platform.cpu_flags", lambda: frozenset({"avx512f"}))
    for argv in ([], ["--kv-dtype", "fp32"]):
        code, out, _ = _run(capsys, "--cache", str(cache), "--json", "--weight-format", "int4-g64", *argv)
        plan = json.loads(out)
        assert code == 0 and plan["memory"]["kv_bytes_per_token"] == 46_080


def test_cpu_local_refuses_a_kv_dtype_the_engine_cannot_keep(capsys, cache):
    """The engine has no KV dtype of its own: the cache is in the weights' dtype."""
    code, out, err = _run(capsys, "--cache", str(cache), "--weight-format", "bf16", "--kv-dtype", "fp8")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--kv-dtype fp8: inferlab's engine keeps the KV cache in the weights' dense dtype (bf16)" in err
    assert _run(capsys, "--cache", str(cache), "--weight-format", "bf16", "--kv-dtype", "BF16")[0] == 0


def test_another_architecture_is_named_before_its_fields(capsys, tmp_path):
    """Once "missing field 'num_attention_heads'" for a GPT-2 config.json."""
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps(
        {"architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_layer": 12, "n_head": 12}))
    code, out, err = _run(capsys, str(tmp_path / "gpt2"), "--hardware", "L4")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "architecture 'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM" in err


def _w8a16(targets: list[str], num_bits: int = 8, group_size: int | None = None) -> dict:
    """A compressed-tensors group as `inferlab quantize --scheme W8A16` (or W4A16) writes it."""
    return {"targets": targets, "input_activations": None, "output_activations": None,
            "weights": {"num_bits": num_bits, "type": "int", "symmetric": True, "dynamic": False,
                        "strategy": "group" if group_size else "channel", "group_size": group_size}}


def _quantized_smollm2(folder: Path, groups: dict) -> Path:
    # SmolLM2-135M's config.json with a quantization_config
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
              "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
              "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True,
              "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                      "config_groups": groups, "ignore": ["lm_head"]}}
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_quantized_checkpoint_plans_its_own_weight_format(capsys, tmp_path):
    """Once planned as bf16 (256.57 MiB) while `inferlab info` said int8 weights."""
    q8 = _quantized_smollm2(tmp_path / "q8", {"group_0": _w8a16(["Linear"])})
    code, out, _ = _run(capsys, str(q8), "--hardware", "L4", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["weight_format"]["name"] == "int8-wo"
    # 106,168,320 linear weights × 1 B + one bf16 scale per output row (30 layers × 5,184 rows)
    # + 28,346,688 embedding and norm params × 2 B
    assert plan["weights"]["total_bytes"] == 106_168_320 + 155_520 * 2 + 28_346_688 * 2
    code, out, _ = _run(capsys, str(q8), "--hardware", "L4", "--weight-format", "bf16", "--json")
    assert json.loads(out)["weights"]["total_bytes"] == 269_030_016


def test_a_mixed_quantized_checkpoint_asks_for_a_weight_format(capsys, tmp_path):
    mixed = _quantized_smollm2(tmp_path / "mixed", {
        "attention": _w8a16(["re:.*self_attn.*"]), "mlp": _w8a16(["re:.*mlp.*"], 4, 64)})
    code, out, err = _run(capsys, str(mixed), "--hardware", "L4")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "mixes weight formats (int4-g64, int8-wo)" in err and "--weight-format" in err
    code, _, _ = _run(capsys, str(mixed), "--hardware", "L4", "--weight-format", "int4-g64")
    assert code == 0


class _SVGCounter(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1


def test_html_report_is_self_contained(capsys, tmp_path, cache):
    html = tmp_path / "plan.html"
    code, _, _ = _run(capsys, "Qwen3-8B", "--hardware", "l40s", "--html", str(html))
    text = html.read_text()
    parser = _SVGCounter()
    parser.feed(text)
    assert code == 0
    assert parser.tags["svg"] == 2 and parser.tags["polyline"] == 2 and parser.tags["rect"] >= 5
    assert "<script" not in text and "http" not in text.split("<pre>")[0].replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium to render the report")
def test_html_report_renders_in_a_real_browser(capsys, tmp_path):
    html = tmp_path / "plan.html"
    code, _, _ = _run(capsys, "Llama-3.1-8B", "--hardware", "h100-sxm", "--html", str(html))
    assert code == 0
    done = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", html.as_uri()],
        capture_output=True, text=True, timeout=120)
    dom = done.stdout
    # the browser parsed both charts into SVG elements with their data points
    assert dom.count("<svg") == 2 and dom.count("<circle") >= 2 * 9
    assert "Decode throughput and inter-token latency" in dom


def test_planner_never_imports_torch(tmp_path):
    """Not even for a quantized checkpoint (torch takes ~3 s to import)."""
    q4 = _quantized_smollm2(tmp_path / "q4", {"group_0": _w8a16(["Linear"], 4, 64)})
    code = (
        "import sys, pkgutil, importlib, inferlab.planner as p\n"
        "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('inferlab.planner.' + m.name)\n"
        "from inferlab.cli import main\n"
        "assert main(['plan', '--hardware', 'h100-sxm', '--json']) == 0\n"
        "assert main(['plan', 'Qwen3-8B', '--hardware', 'b200', '--html', '/dev/null']) == 0\n"
        f"assert main(['plan', {str(q4)!r}, '--hardware', 'L4', '--json']) == 0\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().endswith("NO-TORCH")


def test_the_batch_limit_line_shows_the_step_budget_that_sets_it(capsys):
    # 354 sequences fit on the H100, but steps of 768 keep 768 × 256 / 1,280 = 153 decoding
    assert main(["plan", "Llama-3.1-8B", "--hardware", "H100-SXM"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if "batch limit" in row)
    assert line.split()[2] == "153" and "(its steps keep 768 × 256 / 1,280 sequences decoding" in line
