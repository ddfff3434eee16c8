"""Every GPU check and figure of issue 9 in one run, a few minutes on an H200.

1. ceilings: HBM bandwidth (a device copy, bytes read + written) and the bf16 matmul rate
   (an 8192^3 product), measured here and used as the rooflines below;
2. kernels, compiled for the GPU: Triton paged attention, KV write, RMSNorm, RoPE, W4A16 and
   the W8A8 linears against torch references, then timed against the torch paths;
3. greedy decoding of the embedded model (fp32) by the engine equals transformers `generate`
   with the same weights on the same GPU, and the engine's own with n-gram drafts;
4. a Llama-3.1-8B-shaped model with random bf16 weights built in memory: single-stream decode
   against the HBM roofline, with the engine's CUDA graphs and without; 256 concurrent requests (prompts 128-1024, outputs 128-1024,
   ignore_eos) against the bf16 matmul roofline; the engine against transformers `generate`
   (static batches) on the same requests;
5. W8A8 (int8, fp8) and W4A16 (int4, group 128) decode speed-ups over bf16 on that model;
6. an engine on that model sizing its own KV cache from --gpu-memory-utilization 0.5 (the
   profile run, which every other engine here skips): the cache it picks, the device memory in
   use against half the total, and the memory given back when the engine is dropped.

Every timed engine first runs each class of step shape its timed runs can meet, so that no
Triton compile lands inside a timed figure (warm_specializations says why and which).

Without CUDA it prints "no CUDA device" and exits 0; `--smoke` runs the whole script on CPU
with a tiny model instead, to check the script itself (its figures mean nothing there).

On the lent H200 (its python3 has torch, triton, transformers, pytest; the embedded GGUF is
94 MB, over one call's 64 MiB, so without it step 3 uses a random-weight SmolLM2-135M-shaped
model), the kernel tests compiled on the GPU, then this script:

    export PYTHONPATH=. PYTHONUNBUFFERED=1; python3 -m pytest -q -m gpu tests/kernels 2>&1 |
      tee $OUT/gpu-tests.log; python3 benchmarks/gpu.py --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.log

`--embedded-gguf PATH` points step 3 at the real file where one has been brought over. The
file travels in two calls, since ignored files a call brought stay for the next one: here,
`split -b 60M "$(.venv/bin/python -c 'from inferlab.models.embedded import embedded_model_path
as p; print(p())')" build/gguf.` (build/ is ignored); a first
call `true` carrying build/gguf.aa; then the line above carrying build/gguf.ab, led by
`cat build/gguf.a? > /tmp/smollm2.gguf;` and with `--embedded-gguf /tmp/smollm2.gguf`.

Beside it: gpu_report.py (settings, the report, the timer, step 1), gpu_kernels.py (step 2 and
the quantized layers), gpu_models.py (the models and workloads) and gpu_memory.py (step 6);
steps 3-5 are here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_kernels import QUANT_VARIANTS, kernel_section, quantized_layer  # noqa: E402
from gpu_memory import memory_section  # noqa: E402
from gpu_models import (  # noqa: E402
    SMOLLM_135M,
    TINY,
    Run,
    Workload,
    hf_twin,
    make_engine,
    random_model,
    random_workload,
    run_engine,
    run_transformers,
    sync,
)
from gpu_report import (  # noqa: E402
    Ceilings,
    Report,
    Settings,
    measure_ceilings,
    run_guarded,
    settings_from,
)
from workloads import existing_file, output_file, positive_int, script_parser  # noqa: E402

from inferlab.engine.llm_engine import LLMEngine  # noqa: E402
from inferlab.kernels.attention.metadata import AttentionMetadata, token_positions  # noqa: E402
from inferlab.models.config import ModelConfig  # noqa: E402
from inferlab.models.llama import LlamaForCausalLM  # noqa: E402
from inferlab.models.loader import LoadedModel  # noqa: E402
from inferlab.planner.budget import MemoryConfig, plan_memory  # noqa: E402
from inferlab.planner.memory import weight_bytes, weight_format  # noqa: E402
from inferlab.planner.roofline import ModelCost, model_cost  # noqa: E402

# --- 3. greedy equality with transformers --------------------------------------------------------

def installed_gguf() -> str | None:
    from inferlab.errors import ModelLoadError
    from inferlab.models.embedded import embedded_model_path

    try:
        path = embedded_model_path()
    except ModelLoadError:
        return None
    return path if Path(path).is_file() else None


def greedy_section(s: Settings, report: Report) -> None:
    from inferlab.models.loader import load_model

    gguf = s.embedded_gguf or (None if s.smoke else installed_gguf())  # smoke: the tiny model (half the run)
    if gguf:
        loaded = load_model(gguf, torch.float32, s.device)
        label = "embedded SmolLM2-135M (GGUF)"
        prompts = [loaded.tokenizer.encode(t) for t in (
            "The capital of France is", "def fibonacci(n):", "Once upon a time,",
            "The three laws of thermodynamics state")]
    else:
        loaded = random_model(TINY if s.device.type == "cpu" else SMOLLM_135M, torch.float32,
                              s.device)
        label = "random tiny model (smoke run)" if s.smoke else "random SmolLM2-135M-shaped model (no GGUF here)"
        prompts = random_workload(4, (5, 40), (1, 1), loaded.config.vocab_size, 7).prompts
    work = Workload(prompts, [s.greedy_tokens] * len(prompts))
    engine = make_engine(loaded, "float32", s.device, 2**28, 16, 1024)
    ours = list(run_engine(engine, work, s.device).outputs.values())
    _, theirs = run_transformers(hf_twin(loaded.model), work, s.device, batch=1)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    report.check("greedy", f"{label}, fp32: engine == transformers generate", same == len(ours),
                 f"{same}/{len(ours)} prompts x {s.greedy_tokens} tokens identical")
    drafting = make_engine(loaded, "float32", s.device, 2**28, 16, 1024, speculative_config={
        "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    with_drafts = list(run_engine(drafting, work, s.device).outputs.values())
    same = sum(a == b for a, b in zip(with_drafts, ours, strict=True))
    counters = drafting.spec_counters
    report.check("speculative", f"{label}, fp32: n-gram drafts (verified as decode rows) leave the "
                 "greedy tokens as they are", same == len(ours),
                 f"{same}/{len(ours)} prompts identical; {counters.num_accepted_tokens} of "
                 f"{counters.num_draft_tokens} draft tokens kept")


# --- 4. the 8B-shaped model -----------------------------------------------------------------------

def cost_of(cfg: ModelConfig, fmt: str) -> ModelCost:
    weights = weight_bytes(cfg, weight_format(fmt))
    memory = plan_memory(cfg, weights, MemoryConfig(device_memory_bytes=2**40))
    return model_cost(cfg, weights, weight_format(fmt), memory, tp=1)


def decode_ms_per_token(run: Run) -> float:
    """Mean time of the steps after the first (the prefill step, which samples token 1)."""
    ends = run.step_end_s
    return (ends[-1] - ends[0]) / (len(ends) - 1) * 1e3


def single_stream(engine: LLMEngine, s: Settings, vocab: int) -> Run:
    work = random_workload(1, (s.single_prompt, s.single_prompt),
                           (s.single_output, s.single_output), vocab, 1)
    return run_engine(engine, work, s.device)


# One value of each class Triton compiles an integer kernel argument for: 1, a multiple of 16,
# neither (its specialization rule, part of the key of its kernel cache).
INT_CLASSES = (1, 3, 16)


def warm_up(engine: LLMEngine, s: Settings, vocab: int) -> None:
    """Compile kernels and fill caches and allocator pools before anything is timed."""
    run_engine(engine, random_workload(4, (16, 64), (4, 8), vocab, 99), s.device)
    run_engine(engine, random_workload(1, (8, 8), (8, 8), vocab, 98), s.device)
    warm_specializations(engine)


@torch.inference_mode()
def warm_specializations(engine: LLMEngine) -> None:
    """Compile every variant of the paged-attention kernel that a timed run can launch.

    Triton builds one per class of each integer argument (INT_CLASSES), and three of that
    kernel's change from step to step: sequences, tokens and block-table width
    (kernels/attention/triton_paged.py). warm_up's few short prompts leave most combinations
    unseen, and the 256-request run's first step with, say, 16 sequences or a 64-block table
    would compile that variant inside its elapsed_s, which is to measure the steady state.
    Here: one forward per combination, through the engine's model and cache, writing nothing
    (slot -1); prompt-step shapes always, decode-step shapes only for an eager engine (CUDA
    graphs compile theirs at capture, at their full batch and table width)."""
    runner, block_size = engine.runner, engine.config.block_size
    device = runner.config.device
    shapes = []  # (query lens, block-table width)
    for seqs, width in itertools.product(INT_CLASSES, INT_CLASSES):
        if width * block_size >= 16:  # 16 prompt tokens a sequence must fit its table
            # 16 tokens a sequence (a multiple of 16 in all), and one fewer (neither 1 nor that)
            shapes += [([16] * seqs, width), ([16] * (seqs - 1) + [15], width)]
        if runner.graphed is None:
            shapes.append(([1] * seqs, width))
    for query_lens, width in shapes:
        meta = AttentionMetadata.build(query_lens, query_lens, [[0] * width] * len(query_lens),
                                       block_size, device)
        meta.slot_mapping = torch.full_like(meta.slot_mapping, -1)  # the cache keeps its contents
        positions = token_positions(query_lens, query_lens)[1].to(device)
        ids = torch.zeros(sum(query_lens), dtype=torch.int64, device=device)
        runner.model(ids, positions, runner.kv_caches, meta)
    sync(device)


def roofline_section(s: Settings, report: Report, ceilings: Ceilings, loaded: LoadedModel,
                     kv_bytes: int) -> dict[str, float]:
    cfg, vocab = loaded.config, loaded.config.vocab_size
    cost = cost_of(cfg, "bf16")
    engine = make_engine(loaded, "bfloat16", s.device, kv_bytes, 256, 2048)
    warm_up(engine, s, vocab)
    single = single_stream(engine, s, vocab)
    ms = decode_ms_per_token(single)
    floor_ms = cost.weight_bytes_per_step / ceilings.bandwidth_bytes_per_s * 1e3
    report.add("8B bf16", "single-stream decode", ms, "ms/token")
    report.add("8B bf16", f"HBM roofline (weights {cost.weight_bytes_per_step / 1e9:.1f} GB)",
               floor_ms, "ms/token")
    report.target("8B bf16", "single-stream decode >= 75% of HBM roofline", floor_ms / ms >= 0.75,
                 f"{floor_ms / ms:.0%}")
    work = random_workload(s.num_requests, s.prompt_range, s.output_range, vocab, 2)
    run = run_engine(engine, work, s.device)
    prompt_tokens = sum(len(p) for p in work.prompts)
    tokens_in = prompt_tokens + run.output_tokens - len(work.prompts)  # tokens through the model
    contexts = sum(sum(range(len(p) + n - 1)) for p, n in zip(work.prompts, work.output_lens,
                                                                strict=True))
    # logits only for each step's last token of a sequence: one row per output token
    matmul = (tokens_in * cost.linear_flops_per_token + run.output_tokens * cost.lm_head_flops) / run.elapsed_s
    attention = contexts * cost.attention_flops_per_context_token / run.elapsed_s
    tag = f"{s.num_requests} concurrent"
    report.add("8B bf16", f"{tag}: output throughput", run.output_tokens / run.elapsed_s, "tok/s")
    report.add("8B bf16", f"{tag}: prompt + output tokens", tokens_in / run.elapsed_s, "tok/s")
    report.add("8B bf16", f"{tag}: linear FLOP / bf16 matmul rate", matmul / ceilings.bf16_flops_per_s)
    report.add("8B bf16", f"{tag}: + attention FLOP / bf16 matmul rate",
               (matmul + attention) / ceilings.bf16_flops_per_s)
    sub = work.subset(s.hf_requests)
    ours = run_engine(engine, sub, s.device)
    del engine
    eager = make_engine(loaded, "bfloat16", s.device, 2**30, 256, 2048, enforce_eager=True)
    warm_up(eager, s, vocab)
    eager_ms = decode_ms_per_token(single_stream(eager, s, vocab))
    del eager
    report.add("8B bf16", "single-stream decode without CUDA graphs", eager_ms, "ms/token")
    report.add("8B bf16", "CUDA graphs' single-stream speed-up", eager_ms / ms, "x")
    return {"single_ms": ms, "ours_256_tok_s": run.output_tokens / run.elapsed_s,
            "ours_sub_tok_s": ours.output_tokens / ours.elapsed_s, "sub_outputs": ours.outputs}


def transformers_section(s: Settings, report: Report, loaded: LoadedModel,
                         figures: dict) -> None:
    work = random_workload(s.num_requests, s.prompt_range, s.output_range,
                           loaded.config.vocab_size, 2).subset(s.hf_requests)
    hf = hf_twin(loaded.model)
    run_transformers(hf, Workload(work.prompts[:2], [4, 4]), s.device, 2)  # warm-up
    elapsed, outputs = run_transformers(hf, work, s.device, batch=s.hf_requests)
    hf_tok_s = sum(work.output_lens) / elapsed
    n = s.hf_requests
    report.add("vs HF", f"transformers generate, {n} requests in one static batch", hf_tok_s,
               "useful output tok/s")
    report.add("vs HF", f"engine, the same {n} requests", figures["ours_sub_tok_s"], "tok/s")
    ratio_same = figures["ours_sub_tok_s"] / hf_tok_s
    ratio_256 = figures["ours_256_tok_s"] / hf_tok_s
    report.add("vs HF", f"engine / transformers, same {n} requests", ratio_same, "x")
    report.target("vs HF", f"engine at {s.num_requests} concurrent / transformers >= 10x",
                 ratio_256 >= 10, f"{ratio_256:.1f}x")
    ours = list(figures["sub_outputs"].values())
    first = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), len(x))
             for x, y in zip(ours, outputs, strict=True)]
    report.add("vs HF", "bf16 greedy tokens equal before the first difference (median)",
               float(statistics.median(first)), "tokens")


# --- 5. quantized decode --------------------------------------------------------------------------

BLOCK_LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"),
                 ("mlp", "down_proj"))


def swap_linears(model: LlamaForCausalLM, name: str, device: torch.device
                 ) -> list[tuple[nn.Module, str, nn.Module]]:
    """Quantize every block linear in place (lm_head stays bf16); returns what to restore."""
    swapped = []
    for layer in model.model.layers:
        for owner_name, attr in BLOCK_LINEARS:
            owner = getattr(layer, owner_name)
            original = getattr(owner, attr)
            setattr(owner, attr, quantized_layer(original, name, device))
            swapped.append((owner, attr, original))
    return swapped


def quant_section(s: Settings, report: Report, ceilings: Ceilings, loaded: LoadedModel,
                  kv_bytes: int) -> None:
    cfg = loaded.config
    batch_work = random_workload(s.quant_batch, (s.single_prompt, s.single_prompt),
                                 (s.single_output, s.single_output), cfg.vocab_size, 3)
    base: tuple[float, float] | None = None
    for name in ("bf16", *QUANT_VARIANTS):
        swapped = swap_linears(loaded.model, name, s.device) if name != "bf16" else []
        try:
            engine = make_engine(loaded, "bfloat16", s.device, kv_bytes, s.quant_batch, 2048)
            warm_up(engine, s, cfg.vocab_size)
            single = decode_ms_per_token(single_stream(engine, s, cfg.vocab_size))
            batched = decode_ms_per_token(run_engine(engine, batch_work, s.device))
            del engine
        finally:
            for owner, attr, original in swapped:
                setattr(owner, attr, original)
            del swapped
        fmt = QUANT_VARIANTS[name][1] if name != "bf16" else "bf16"
        floor = cost_of(cfg, fmt).weight_bytes_per_step / ceilings.bandwidth_bytes_per_s * 1e3
        report.add("quantized", f"{name}: single-stream decode", single, "ms/token")
        report.add("quantized", f"{name}: single stream / {fmt} HBM roofline", floor / single)
        report.add("quantized", f"{name}: decode step at batch {s.quant_batch}", batched, "ms")
        if base is None:
            base = (single, batched)
        else:
            report.add("quantized", f"{name}: decode speed-up over bf16, batch 1",
                       base[0] / single, "x")
            report.add("quantized", f"{name}: decode speed-up over bf16, batch {s.quant_batch}",
                       base[1] / batched, "x")


# --- the run ---------------------------------------------------------------------------------------

def header(s: Settings) -> None:
    import inferlab.models.llama as llama

    name = torch.cuda.get_device_name() if s.device.type == "cuda" else "CPU (smoke run)"
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    print(f"device {name}; torch {torch.__version__}; triton {triton_version}; "
          f"model attention path: {llama.paged_attention.__module__}", flush=True)


def kv_budget(s: Settings, reserve_bytes: int, cap_bytes: int) -> int:
    if s.device.type != "cuda":
        return 2**26
    free, _ = torch.cuda.mem_get_info()
    return max(2**30, min(cap_bytes, free - reserve_bytes))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--smoke", action="store_true",
                        help="run every step on CPU with a tiny model (checks the script only)")
    parser.add_argument("--json", type=output_file, help="also write the figures to this file")
    parser.add_argument("--num-requests", type=positive_int, default=256)
    parser.add_argument("--hf-requests", type=positive_int, default=64,
                        help="requests both engines run for the transformers comparison")
    parser.add_argument("--embedded-gguf", type=existing_file,
                        help="the embedded model's GGUF file, if not installed")
    parser.add_argument("--skip", nargs="*", default=[], choices=("kernels", "greedy", "8b", "hf",
                                                                 "quant", "memory"))
    args = parser.parse_args(argv)
    if args.hf_requests > args.num_requests:
        parser.error(f"argument --hf-requests: at most --num-requests ({args.num_requests}), "
                     f"got {args.hf_requests}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: benchmarks/gpu.py measures GPU figures and has nothing to do here "
              "(--smoke runs it on CPU with a tiny model, to check the script itself)")
        return 0
    s = settings_from(args)
    report = Report(smoke=s.smoke)
    header(s)
    ceilings = measure_ceilings(s, report)
    if "kernels" not in args.skip:
        kernel_section(s, report, ceilings)
    if "greedy" not in args.skip:
        run_guarded(greedy_section, report, s, report)
    loaded = random_model(s.model, torch.bfloat16, s.device)
    figures: dict = {}
    if "8b" not in args.skip:
        kv = kv_budget(s, reserve_bytes=16 * 2**30, cap_bytes=72 * 2**30)
        run_guarded(lambda: figures.update(roofline_section(s, report, ceilings, loaded, kv)),
                    report)
    if figures and "hf" not in args.skip:
        run_guarded(transformers_section, report, s, report, loaded, figures)
    if "quant" not in args.skip:
        run_guarded(quant_section, report, s, report, ceilings, loaded,
                    kv_budget(s, reserve_bytes=32 * 2**30, cap_bytes=8 * 2**30))
    if "memory" not in args.skip:  # last: every earlier engine should have given its memory back
        run_guarded(memory_section, report, s, report, loaded)
    print(f"\n{len(report.failures)} failed check(s)" + "".join(f"\n  {f}" for f in report.failures))
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_json(), indent=1))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
