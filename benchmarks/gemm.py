"""Linear layers on this CPU as the engine runs them, beside torch's F.linear, on the embedded
model's four linear shapes, by row count (1 = a decode token, 2,048 = an offline prefill step), in
interleaved rounds: bf16 through the packed C kernels (inferlab/kernels/cpu/matmul.c: AVX512-BF16
up to 4 rows, AMX tiles above) against F.linear's oneDNN; with --dtype float32, oneDNN's fp32
matmul (inferlab/kernels/onednn_linear.py) against F.linear's MKL sgemm. Prints ms, TFLOP/s, the
ratio and each side's fraction of the matmul rate `inferlab.planner.measure` finds in the same run.

With --model-pass: instead, all of the model's linears (30 layers' four and the lm_head, 269 MB
of bf16 weights, 538 MB of fp32: eight times the L3 or more) called in the model's order, as a
forward pass meets them, so each one's weights come from memory; the median pass of each side,
alternating.

    .venv/bin/python benchmarks/gemm.py [--dtype float32] [--rows 1 16 64 512 2048] [--rounds 3]
        [--model-pass]
"""

from __future__ import annotations

import statistics

import torch
from workloads import machine_roofline, positive_int, script_parser

from inferlab.kernels import cpu_ops
from inferlab.kernels.cpu_linear import PackedLinear
from inferlab.kernels.onednn_linear import OneDnnLinear
from inferlab.timing import best_seconds

# dtype -> (the engine's layer for it, what F.linear runs on it)
KERNELS = {"bfloat16": (PackedLinear, "oneDNN"), "float32": (OneDnnLinear, "MKL")}

SHAPES = {"qkv_proj": (576, 960), "o_proj": (576, 576), "gate_up_proj": (576, 3072),
          "down_proj": (1536, 576)}  # (in, out) of SmolLM2-135M's linears


@torch.no_grad()
def medians(dense: torch.nn.Linear, kernel: type[torch.nn.Module], x: torch.Tensor,
            rounds: int) -> tuple[float, float]:
    """Median seconds of the engine's kernel and of F.linear, measured in alternation."""
    packed = kernel(dense)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(best_seconds(lambda: packed(x), 5))
        theirs.append(best_seconds(lambda: torch.nn.functional.linear(x, dense.weight), 5))
    return statistics.median(ours), statistics.median(theirs)


def model_linears(dtype: torch.dtype) -> list[torch.nn.Linear]:
    """Random linears of the embedded model's shapes, in the order a forward pass calls them."""
    from inferlab.models.loader import read_model_config
    from inferlab.models.model_path import resolve_model_path

    cfg = read_model_config(resolve_model_path(None))
    layer = [(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size), (cfg.q_size, cfg.hidden_size),
             (cfg.hidden_size, 2 * cfg.intermediate_size), (cfg.intermediate_size, cfg.hidden_size)]
    shapes = layer * cfg.num_layers + [(cfg.hidden_size, cfg.vocab_size)]
    return [torch.nn.Linear(k_in, n_out, bias=False).to(dtype) for k_in, n_out in shapes]


@torch.no_grad()
def model_pass(rows: list[int], rounds: int, peak: float, dtype_name: str) -> None:
    dtype = getattr(torch, dtype_name)
    kernel, reference = KERNELS[dtype_name]
    dense = model_linears(dtype)
    packed = [kernel(d) for d in dense]
    weight_bytes = sum(d.weight.numel() * dtype.itemsize for d in dense)
    print(f"the model's {len(dense)} linears in order, {weight_bytes / 1e6:.0f} MB of weights")
    for n in rows:
        xs = [torch.randn(n, d.in_features, dtype=dtype) for d in dense]
        flops = sum(2 * n * d.in_features * d.out_features for d in dense)
        sides = {"ours": lambda xs=xs: [p(x) for p, x in zip(packed, xs, strict=True)],
                 reference: lambda xs=xs: [torch.nn.functional.linear(x, d.weight)
                                          for d, x in zip(dense, xs, strict=True)]}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(rounds):
            for name, run in sides.items():
                times[name].append(best_seconds(run, 1))
        a, b = statistics.median(times["ours"]), statistics.median(times[reference])
        print(f"rows {n:5d} ours {a * 1e3:8.2f} ms ({flops / a / 1e12:.2f} TFLOP/s = {flops / a / peak:4.0%}, "
              f"weights at {weight_bytes / a / 1e9:.0f} GB/s)  {reference} {b * 1e3:8.2f} ms ({flops / b / 1e12:.2f}, "
              f"{flops / b / peak:4.0%}, {weight_bytes / b / 1e9:.0f} GB/s)  RATIO {b / a:.2f}x")


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--rows", type=positive_int, nargs="+", default=[1, 16, 64, 512, 2048])
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(KERNELS))
    parser.add_argument("--model-pass", action="store_true",
                        help="the model's linears in order, weights from memory (see above)")
    args = parser.parse_args()
    if args.dtype == "bfloat16" and not cpu_ops.bf16_linear_available():
        raise SystemExit("the packed bf16 kernels need AVX512-BF16 and a C compiler")
    dtype, (kernel, reference) = getattr(torch, args.dtype), KERNELS[args.dtype]
    peak = machine_roofline()["peak_flops"]["bf16" if args.dtype == "bfloat16" else "fp32"]
    print(f"{torch.get_num_threads()} threads, AMX {'on' if cpu_ops.amx_available() else 'off'}, "
          f"{args.dtype} matmul rate measured now {peak / 1e12:.2f} TFLOP/s; medians of {args.rounds} "
          f"interleaved rounds")
    torch.manual_seed(0)
    if args.model_pass:
        model_pass(args.rows, args.rounds, peak, args.dtype)
        return
    for rows in args.rows:
        for name, (k_in, n_out) in SHAPES.items():
            dense = torch.nn.Linear(k_in, n_out, bias=False).to(dtype)
            a, b = medians(dense, kernel, torch.randn(rows, k_in, dtype=dtype), args.rounds)
            flops = 2 * rows * k_in * n_out
            print(f"rows {rows:5d} {name:13} ours {a * 1e3:7.3f} ms ({flops / a / 1e12:.2f} TFLOP/s, "
                  f"{flops / a / peak:4.0%})  {reference} {b * 1e3:7.3f} ms ({flops / b / 1e12:.2f}, "
                  f"{flops / b / peak:4.0%})  RATIO {b / a:.2f}x")


if __name__ == "__main__":
    main()
