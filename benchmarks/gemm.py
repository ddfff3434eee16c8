"""bf16 linear layers on this CPU: the packed C kernels (inferlab/kernels/cpu/matmul.c: AVX512-BF16
up to 4 rows, AMX tiles above) beside torch's F.linear (oneDNN) on the embedded model's four
linear shapes, by row count (1 = a decode token, 2,048 = an offline prefill step), in interleaved
rounds. Prints ms, TFLOP/s, the ratio and each side's fraction of the matmul rate
`inferlab.planner.measure` finds in the same run.

    .venv/bin/python benchmarks/gemm.py [--rows 1 16 64 512 2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from workloads import machine_roofline

from inferlab.kernels import cpu_ops
from inferlab.kernels.cpu_linear import PackedLinear
from inferlab.planner.measure import best_seconds

SHAPES = {"qkv_proj": (576, 960), "o_proj": (576, 576), "gate_up_proj": (576, 3072),
          "down_proj": (1536, 576)}  # (in, out) of SmolLM2-135M's linears


@torch.no_grad()
def medians(dense: torch.nn.Linear, x: torch.Tensor, rounds: int) -> tuple[float, float]:
    """Median seconds of the packed kernels and of F.linear, measured in alternation."""
    packed = PackedLinear(dense)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(best_seconds(lambda: packed(x), 5))
        theirs.append(best_seconds(lambda: torch.nn.functional.linear(x, dense.weight), 5))
    return statistics.median(ours), statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 512, 2048])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not cpu_ops.bf16_linear_available():
        raise SystemExit("the packed bf16 kernels need AVX512-BF16 and a C compiler")
    peak = machine_roofline()["peak_flops"]["bf16"]
    print(f"{torch.get_num_threads()} threads, AMX {'on' if cpu_ops.amx_available() else 'off'}, "
          f"bf16 matmul rate measured now {peak / 1e12:.2f} TFLOP/s; medians of {args.rounds} interleaved rounds")
    torch.manual_seed(0)
    for rows in args.rows:
        for name, (k_in, n_out) in SHAPES.items():
            dense = torch.nn.Linear(k_in, n_out, bias=False).to(torch.bfloat16)
            a, b = medians(dense, torch.randn(rows, k_in, dtype=torch.bfloat16), args.rounds)
            flops = 2 * rows * k_in * n_out
            print(f"rows {rows:5d} {name:13} ours {a * 1e3:7.3f} ms ({flops / a / 1e12:.2f} TFLOP/s, "
                  f"{flops / a / peak:4.0%})  oneDNN {b * 1e3:7.3f} ms ({flops / b / 1e12:.2f}, "
                  f"{flops / b / peak:4.0%})  RATIO {b / a:.2f}x")


if __name__ == "__main__":
    main()
