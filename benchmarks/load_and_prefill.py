"""Load time of the embedded model (its default 2 GiB KV cache included), peak RSS after load, and
one 512-token prefill at fp32 and bf16, against the matmul roofline measured in the same run.

Each run loads in a fresh process (so the load includes importing torch): fp32 first, with the
page cache as the last run left it, then bf16, then fp32 again with the model's file in the page
cache (the third line). The prefill is one sequence through the engine, best of three.

    .venv/bin/python benchmarks/load_and_prefill.py
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
from inferlab.engine.llm import LLM
from inferlab.engine.sampling_params import SamplingParams
dtype = sys.argv[1]
llm = LLM(dtype=dtype)  # the default KV cache, as `inferlab serve` starts
load_s = time.perf_counter() - t0
rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
prompt = [(13 * i) % 40000 + 100 for i in range(512)]
params = SamplingParams(max_tokens=1)
llm.generate([prompt[::-1]], params)  # warm up
best = 1e9
for _ in range(3):
    llm.engine.scheduler.reset_prefix_cache()
    t = time.perf_counter()
    llm.generate([prompt], params)
    best = min(best, time.perf_counter() - t)
print(json.dumps({"dtype": dtype, "load_s": load_s, "rss_mib": rss_mib, "prefill_512_s": best}))
"""


def main() -> None:
    from workloads import machine_roofline, prefill_flops_per_token, script_parser

    script_parser(__doc__).parse_args()

    from inferlab.engine.platform import cpu_has_fast_bf16
    from inferlab.models.embedded import embedded_model_path
    from inferlab.models.loader import read_model_config

    roof = machine_roofline()
    flops_per_token = prefill_flops_per_token(read_model_config(embedded_model_path()), 512)
    for run, dtype in enumerate(("float32", "bfloat16", "float32")):
        out = subprocess.run([sys.executable, "-c", CHILD, dtype], capture_output=True, text=True,
                             check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        peak = roof["peak_flops"]["bf16" if dtype == "bfloat16" else "fp32"]
        tps = 512 / r["prefill_512_s"]
        label = f"{dtype} (file cached)" if run == 2 else dtype
        # without AMX or AVX512-BF16 torch's bf16 matmul is emulated: its rate is no roof
        roof_share = (f"{tps * flops_per_token / peak:.0%} of the {dtype} matmul roofline"
                      if dtype == "float32" or cpu_has_fast_bf16()
                      else "no roofline: this CPU has no native bf16 (--dtype auto runs fp32)")
        print(f"{label:8s}: load {r['load_s']:.1f} s (torch import included), peak RSS "
              f"{r['rss_mib']:.0f} MiB, 512-token prefill {r['prefill_512_s'] * 1e3:.0f} ms = "
              f"{tps:.0f} tok/s = {roof_share}")


if __name__ == "__main__":
    main()
