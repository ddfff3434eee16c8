"""Issue 7's accuracy table: perplexity of each compression of the embedded model vs fp32.

Quantizes the embedded model once per configuration (`inferlab quantize`, default calibration:
128 windows of 512 tokens of WikiText-2 valid), scores each checkpoint and the fp32 baseline on
the WikiText-2 test text (`inferlab eval --dtype float32`, windows of 2048 tokens), and prints a
markdown table with each goal. Checkpoints and JSON results go to out/accuracy/ (or --out-dir)
and are reused.

    .venv/bin/python benchmarks/accuracy_table.py [--limit N] [--only NAME ...] [--out-dir DIR]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workloads import positive_int, script_parser

ROOT = Path(__file__).resolve().parent.parent
INFERLAB = [sys.executable, "-m", "inferlab.cli"]

# name -> quantize flags
CONFIGS = {
    "W8A16 RTN": ["--scheme", "W8A16", "--method", "rtn"],
    "W8A8 SmoothQuant": ["--scheme", "W8A8", "--method", "smoothquant"],
    "FP8_DYNAMIC": ["--scheme", "FP8_DYNAMIC", "--method", "rtn"],
    "FP8_DYNAMIC GPTQ": ["--scheme", "FP8_DYNAMIC", "--method", "gptq"],
    # llm-compressor's FP8 preset: per-tensor weights, static per-tensor activation scales
    "FP8 static RTN": ["--scheme", "FP8", "--method", "rtn"],
    "FP8 static GPTQ": ["--scheme", "FP8", "--method", "gptq"],
    "FP8 static SmoothQuant": ["--scheme", "FP8", "--method", "smoothquant"],
    # DeepSeek-V3's fp8 blocks; 576 inputs do not split into 128s: blocks of 64
    "FP8_BLOCK 64 RTN": ["--scheme", "FP8_BLOCK", "--method", "rtn", "--group-size", "64"],
    # the embedded model's 576-wide inputs are not a multiple of 128: groups of 64
    "W4A16 g64 RTN": ["--scheme", "W4A16", "--method", "rtn", "--group-size", "64"],
    "W4A16 g64 GPTQ": ["--scheme", "W4A16", "--method", "gptq", "--group-size", "64"],
    "W4A16 g64 AWQ": ["--scheme", "W4A16", "--method", "awq", "--group-size", "64"],
    "2:4 magnitude": ["--sparsity", "2:4", "--method", "magnitude"],
    "2:4 SparseGPT": ["--sparsity", "2:4", "--method", "sparsegpt"],
}


def slug(name: str) -> str:
    return name.lower().replace(" ", "-").replace(":", "of")


def evaluate(model: str | None, out: Path, limit: int | None) -> float:
    if not out.is_file():
        cmd = INFERLAB + ["eval"] + ([model] if model else []) + [
            "--dtype", "float32", "--output", str(out)] + (["--limit", str(limit)] if limit else [])
        subprocess.run(cmd, check=True)
    return json.loads(out.read_text())["ppl"]


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="windows per evaluation (all: 147)")
    # "+": a bare --only once ran all 13 configurations, hours
    parser.add_argument("--only", nargs="+", default=None, choices=CONFIGS, metavar="NAME",
                        help=f"configuration names to run, of: {', '.join(map(repr, CONFIGS))}")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "out" / "accuracy",
                        help="where checkpoints and results go and are reused (default: %(default)s)")
    args = parser.parse_args()
    work = args.out_dir / (f"limit{args.limit}" if args.limit else "full")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"argument --out-dir: cannot create {work}: {e.strerror}")
    base = evaluate(None, work / "baseline.json", args.limit)
    ppl = {}
    for name, flags in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        checkpoint = work / slug(name)
        if not (checkpoint / "config.json").is_file():
            subprocess.run(INFERLAB + ["quantize", *flags, "--out", str(checkpoint), "--quiet"],
                           check=True)
        ppl[name] = evaluate(str(checkpoint), work / f"{slug(name)}.json", args.limit)
    print_table(base, ppl)


def print_table(base: float, ppl: dict[str, float]) -> None:
    rise = {name: p / base - 1 for name, p in ppl.items()}
    print(f"\n| configuration | perplexity | vs fp32 ({base:.4f}) |\n|---|---|---|")
    for name, p in ppl.items():
        print(f"| {name} | {p:.4f} | {rise[name]:+.2%} |")
    goals = [(["W8A16 RTN"], lambda r: r["W8A16 RTN"] <= 0.005, "W8A16 RTN within +0.5%"),
             (["W8A8 SmoothQuant"], lambda r: r["W8A8 SmoothQuant"] <= 0.02,
              "W8A8 SmoothQuant within +2%"),
             (["FP8_DYNAMIC"], lambda r: r["FP8_DYNAMIC"] <= 0.02, "FP8_DYNAMIC RTN within +2%"),
             (["FP8_DYNAMIC GPTQ"], lambda r: r["FP8_DYNAMIC GPTQ"] <= 0.02,
              "FP8_DYNAMIC GPTQ within +2%")]
    for method in ("GPTQ", "AWQ"):
        name = f"W4A16 g64 {method}"
        goals.append(([name, "W4A16 g64 RTN"], lambda r, n=name: r[n] <= 0.75 * r["W4A16 g64 RTN"],
                      f"{method} cuts RTN's W4A16 increase by >= 25%"))
    print()
    for needed, check, text in goals:
        if set(needed) <= set(rise):
            print(f"{'PASS' if check(rise) else 'FAIL'}: {text}")
    if {"2:4 magnitude", "2:4 SparseGPT"} <= set(ppl):
        ratio = ppl["2:4 SparseGPT"] / ppl["2:4 magnitude"]
        print(f"{'PASS' if ratio <= 0.7 else 'FAIL'}: 2:4 SparseGPT / magnitude perplexity "
              f"{ratio:.3f} (goal <= 0.7)")


if __name__ == "__main__":
    main()
