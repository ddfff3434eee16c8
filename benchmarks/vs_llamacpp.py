"""Single-stream decode and a 512-token prefill: inferlab (bf16, W4A16, W8A8) beside llama.cpp.

llama.cpp is the usual choice without a GPU; DESIGN.md quotes ~98 tokens/s single-stream decode
on this machine for the embedded model's own Q4_1 GGUF. This runs both in one go: `llama-bench`
(a build of yours, `--llama-bench PATH`; nothing of llama.cpp is in this repository) on the
embedded GGUF, `tg128` and `pp512`, and inferlab's engine on the same model, decoding 128 tokens
after a 300-token prompt (greedy, `ignore_eos`), rounds interleaved. Decode rate = tokens after
the first / the time between the first and the last; prefill = 512 / time to the first token.

    .venv/bin/python benchmarks/vs_llamacpp.py --llama-bench /path/to/llama-bench [--rounds 3]

W4A16 (g64, RTN) and W8A8 checkpoints are written to a temporary directory first with
`inferlab quantize` (speed does not depend on how the codes were chosen).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workloads import existing_file, exit_on_sigterm, positive_int, script_parser, thread_count

from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
from inferlab.models.embedded import embedded_model_path

SCHEMES = {"W4A16": ["--scheme", "W4A16", "--group-size", "64"], "W8A8": ["--scheme", "W8A8"]}


def llama_bench(binary: str, gguf: str, threads: int) -> dict[str, float]:
    """tokens/s of llama-bench's tg128 and pp512 on `gguf`."""
    out = subprocess.run([binary, "-m", gguf, "-t", str(threads), "-p", "512", "-n", "128",
                          "-r", "3", "-o", "json"], capture_output=True, text=True, check=True)
    rates = {}
    for test in json.loads(out.stdout):
        kind = "decode" if test["n_gen"] else "prefill"
        rates[kind] = test["avg_ts"]
    return rates


def inferlab_rates(llm: LLM, prompt: list[int]) -> dict[str, float]:
    """Greedy decode rate after `prompt` and the rate of a 512-token prefill, tokens/s."""
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    engine = llm.engine
    engine.scheduler.reset_prefix_cache()
    engine.add_request(prompt, params)
    stamps = []
    while engine.has_unfinished_requests():
        engine.step()
        stamps.append(time.perf_counter())
    long_prompt = (prompt * 2)[:512]
    engine.scheduler.reset_prefix_cache()
    start = time.perf_counter()
    llm.generate([long_prompt], SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    prefill_s = time.perf_counter() - start
    return {"decode": (len(stamps) - 1) / (stamps[-1] - stamps[0]), "prefill": 512 / prefill_s}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--llama-bench", required=True, type=existing_file,
                        help="path to a llama.cpp llama-bench binary")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count, default=2)
    args = parser.parse_args()
    if not os.access(args.llama_bench, os.X_OK):
        parser.error(f"argument --llama-bench: {args.llama_bench} is not executable")
    exit_on_sigterm()  # the quantized checkpoints' temporary folder removed
    gguf = embedded_model_path()
    prompt = [(13 * i) % 40000 + 100 for i in range(300)]
    with tempfile.TemporaryDirectory() as tmp:
        models = {"bf16": None}
        for name, flags in SCHEMES.items():
            out = Path(tmp) / name
            subprocess.run([sys.executable, "-m", "inferlab.cli", "quantize", *flags, "--out", str(out),
                            "--quiet"], check=True, stdout=subprocess.DEVNULL)
            models[name] = str(out)
        engines = {name: LLM(path, dtype="bfloat16", kv_cache_memory="512MiB", num_threads=args.threads)
                   for name, path in models.items()}
        for llm in engines.values():
            inferlab_rates(llm, prompt)  # warm-up: kernels built, caches touched
        results: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                for kind, rate in inferlab_rates(llm, prompt).items():
                    results.setdefault(f"inferlab {name}", {}).setdefault(kind, []).append(rate)
            for kind, rate in llama_bench(args.llama_bench, gguf, args.threads).items():
                results.setdefault("llama.cpp Q4_1", {}).setdefault(kind, []).append(rate)
    median = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in results.items()}
    reference = median["llama.cpp Q4_1"]
    print(f"median of {args.rounds} interleaved rounds, {args.threads} threads")
    print(f"{'':18} {'decode tok/s':>13} {'x llama.cpp':>12} {'prefill tok/s':>14} {'x llama.cpp':>12}")
    for name, rates in median.items():
        print(f"{name:18} {rates['decode']:13.1f} {rates['decode'] / reference['decode']:12.2f} "
              f"{rates['prefill']:14.1f} {rates['prefill'] / reference['prefill']:12.2f}")


if __name__ == "__main__":
    main()
