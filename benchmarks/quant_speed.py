"""Quantized linears vs the dense model on this CPU: decode at batch 1, a 512-token prefill,
resident bytes.

One model (default: the embedded SmolLM2-135M) is loaded in --dtype (default: what the
engine's --dtype auto runs here: bf16 on a CPU with AVX512-BF16 or AMX, else fp32); each scheme's linear layers
are built from round-to-nearest codes (speed does not depend on how the codes were chosen) and
put into a copy of the model, so every variant has the same embeddings, norms and attention.
In fp32 on a CPU with the AVX2 kernels, the dense model's weights are held in fp32 ("fp32"), and
two variants hold the same arithmetic in fewer bytes: "bf16-held", the decoder linears' weights
rounded to bf16 and held so (what a bf16 checkpoint run in fp32 gets: Avx2Fp32Linear's
narrow_to_bf16), and "gguf-held", for a GGUF model of Q4_1 / Q4_0 / Q8_0 blocks (the embedded one),
its decoder linears held as those codes, the weights and outputs unchanged (narrow_to_codes: what
the engine runs such a model with).

This machine's speed moves in phases of seconds, so variants are measured interleaved: in each
of `--rounds` rounds every variant prefills, then decodes in a turn of its own (the first of
either series rotating from round to round), each in its own KV cache, so that every phase
weighs on all of them alike. A turn times its steps after `--warm-steps` untimed ones, the
steady state of a model that decodes on (interleaved_decode_ms; `--warm-steps 1` gives the
older figures, nearer a step that finds the weights in memory). Medians are taken: compare the
ratios, not the absolute times.

Run: .venv/bin/python benchmarks/quant_speed.py [MODEL] [--rounds 3] [--dtype bfloat16|float32]
     [--warm-steps 16] [--lm-head] [--layer-sweep] [--json out.json]
(The linears alone against a plain read of their bytes: benchmarks/linear_floor.py.)
Targets (issue 7): W8A16 decode >= 1.5x bf16, W4A16 decode >= 2x, W8A8 prefill >= 1.2x;
resident linear bytes <= 0.55x (int8) and <= 0.35x (int4) of bf16.
"""

from __future__ import annotations

import atexit
import copy
import gc
import json
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from workloads import (
    bounded_int,
    model_path,
    output_file,
    positive_int,
    scheme_list,
    script_parser,
    thread_count,
)

from inferlab.engine.platform import resolve_dtype
from inferlab.kernels.attention.metadata import AttentionMetadata
from inferlab.kernels.avx2_fp32_linear import Avx2Fp32Linear
from inferlab.kernels.cpu_linear import PackedLinear, packed_linear_supported
from inferlab.kernels.linear_choice import use_engine_linears
from inferlab.models.loader import load_model
from inferlab.quant.layer import LINEARS
from inferlab.quant.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear, build_quant_linear
from inferlab.quant.qparams import quantize_rtn
from inferlab.quant.scheme import SCHEME_NAMES, make_scheme
from inferlab.timing import best_seconds

BLOCK_SIZE = 16
# static FP8 needs the input scales a calibration finds, which round-to-nearest codes lack
RTN_SCHEMES = tuple(name for name in SCHEME_NAMES if name != "FP8")
DENSE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def largest_group(net: nn.Module, wanted: int) -> int:
    """`wanted` if it divides every linear's inputs, else the largest power of two that does."""
    inputs = {net.model.layers[0].get_submodule(n).in_features for n in LINEARS}
    for g in (wanted, 128, 64, 32):
        if all(k % g == 0 for k in inputs) and g <= wanted:
            return g
    raise SystemExit(f"no group size divides the inputs {sorted(inputs)}")


def measured(name: str, with_lm_head: bool) -> bool:
    """The layers a variant replaces: every decoder linear, and the lm_head when asked."""
    return (name.startswith("model.layers.") and name.split(".", 3)[-1] in LINEARS) or (
        with_lm_head and name == "lm_head")


def quantized_modules(net: nn.Module, scheme_name: str, group: int,
                      with_lm_head: bool) -> dict[str, nn.Module]:
    scheme = make_scheme(scheme_name, group)
    out = {}
    for name, module in net.named_modules():
        if measured(name, with_lm_head):
            qw = quantize_rtn(module.weight.data.float(), scheme.weights)
            out[name] = build_quant_linear(qw, scheme.activations, None, module.weight.dtype)
    return out


def held_copies(dense: dict[str, nn.Module], hold: Callable[[Avx2Fp32Linear], bool]) -> dict[str, nn.Module]:
    """Copies of the decoder's fp32 kernel layers, each held as hold(copy) holds it in place, or
    {} when one cannot be."""
    held = {}
    for name, module in dense.items():
        if isinstance(module, Avx2Fp32Linear) and name != "lm_head":
            copied = copy.deepcopy(module)
            if not hold(copied):
                return {}
            held[name] = copied
    return held


def rounded_to_bf16(layer: Avx2Fp32Linear) -> bool:
    """The layer's weights rounded to bf16, then held in bf16."""
    layer.packed.copy_(layer.packed.to(torch.bfloat16).float())
    return layer.narrow_to_bf16()


def variant_net(net: nn.Module, modules: dict[str, nn.Module]) -> nn.Module:
    """A copy of `net` with `modules` in place of the layers of the same names."""
    variant = copy.deepcopy(net)
    for name, module in modules.items():
        parent, _, leaf = name.rpartition(".")
        setattr(variant.get_submodule(parent), leaf, module)
    return variant


def linear_bytes(modules: dict[str, nn.Module]) -> int:
    """Bytes of every tensor the layers keep (weights or codes, scales, packed copies)."""
    return sum(t.numel() * t.element_size() for m in modules.values()
               for t in [*m.parameters(), *m.buffers()])


def _caches(net: nn.Module, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = net.config
    shape = (-(-tokens // BLOCK_SIZE), BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    dtype = net.model.norm.weight.dtype  # the embedding may be read from a packed head
    return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(cfg.num_layers)]


@torch.no_grad()
def prefill_ms(net: nn.Module, ids: torch.Tensor) -> float:
    n = ids.numel()
    caches = _caches(net, n)
    meta = AttentionMetadata.build([n], [n], [list(range(len(caches[0][0])))], BLOCK_SIZE)
    start = time.perf_counter()
    net.compute_logits(net(ids, torch.arange(n), caches, meta)[-1:])
    return (time.perf_counter() - start) * 1e3


class DecodeStepper:
    """One variant's greedy decode at batch 1 after a prompt, one step per call, in a KV cache
    of its own."""

    @torch.no_grad()
    def __init__(self, net: nn.Module, prompt: torch.Tensor, steps: int) -> None:
        self.net, self.length = net, prompt.numel()
        self.caches = _caches(net, self.length + steps)
        self.table = [list(range(len(self.caches[0][0])))]
        meta = AttentionMetadata.build([self.length], [self.length], self.table, BLOCK_SIZE)
        self.logits = net.compute_logits(net(prompt, torch.arange(self.length), self.caches, meta)[-1:])

    @torch.no_grad()
    def step_ms(self) -> float:
        token = self.logits.argmax(-1)
        meta = AttentionMetadata.build([1], [self.length + 1], self.table, BLOCK_SIZE)
        start = time.perf_counter()
        self.logits = self.net.compute_logits(
            self.net(token, torch.tensor([self.length]), self.caches, meta))
        elapsed_ms = (time.perf_counter() - start) * 1e3
        self.length += 1
        return elapsed_ms


def in_turn(names: list[str], first: int) -> list[str]:
    """names from the `first`-th (modulo their number), then the ones before it: the first of a
    series after the decode turns finds the caches full of another variant's weights."""
    return names[first % len(names):] + names[:first % len(names)]


def interleaved_decode_ms(nets: dict[str, nn.Module], prompt: torch.Tensor, steps: int,
                          warm_steps: int, first: int) -> dict[str, list[float]]:
    """`steps` consecutive decode step times of each variant, the variants in turn from the
    `first`-th (callers rotate it), so that a slow second of the machine falls on all of them.
    Each turn's first `warm_steps` are not kept: they find the caches full of the previous
    variant's weights, where a model that decodes on finds some of its own in the L3 from the
    steps before, more of a smaller model's. On the Intel Xeon of session 70 (480 MiB of L3
    reported) W8A16's and W4A16's steps kept getting faster for ~12 steps after a turn's first
    (W8A16 7.96 -> 6.4-6.6 ms, W4A16 5.93 -> 3.8-4.0; bf16 ~10.2 throughout): 16 by default."""
    times = {}
    for name in in_turn(list(nets), first):
        stepper = DecodeStepper(nets[name], prompt, warm_steps + steps)
        times[name] = [stepper.step_ms() for _ in range(warm_steps + steps)][warm_steps:]
    return times


def _paths_ms(x: torch.Tensor, layers: dict[str, nn.Module], reps: int) -> dict[str, float]:
    return {name: best_seconds(lambda layer=layer: layer(x), reps) * 1e3 for name, layer in layers.items()}


@torch.no_grad()
def layer_sweep(net: nn.Module, group: int, reps: int) -> dict:
    """Speed vs packed bf16 of each weight-only layer on the model's linear shapes, by row count:
    the C kernels the engine runs in bf16 (PackedQuantLinear) and torch's CPU kernels, which
    fp32 models and CPUs without AVX512-BF16 get; the evidence for the row thresholds in
    inferlab/quant/linear.py."""
    layer = net.model.layers[0]
    out = {}
    for name in LINEARS:
        dense = layer.get_submodule(name)
        w = dense.weight.data  # bf16 [N, K]
        i8 = quantize_rtn(w.float(), make_scheme("W8A16").weights)
        i4 = quantize_rtn(w.float(), make_scheme("W4A16", group).weights)
        layers = {"bf16": PackedLinear(dense) if packed_linear_supported(w.device, w.dtype) else dense,
                  "int8_c": build_quant_linear(i8, None, None, torch.bfloat16),
                  "int4_c": build_quant_linear(i4, None, None, torch.bfloat16),
                  "int8_torch": Int8WeightOnlyLinear(i8, None, torch.bfloat16),
                  "int4_torch": Int4WeightOnlyLinear(i4, None, torch.bfloat16)}
        print(f"{name} {tuple(w.shape)}: rows, bf16 ms | x bf16: int8 C, int4 C | int8 torch, int4 torch")
        for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
            t = _paths_ms(torch.randn(rows, w.shape[1], dtype=torch.bfloat16), layers, reps)
            ratio = {k: t["bf16"] / v for k, v in t.items() if k != "bf16"}
            out[f"{name}/{rows}"] = {"bf16_ms": t["bf16"], **ratio}
            print(f"  {rows:4d} {t['bf16']:8.3f} | {ratio['int8_c']:5.2f} {ratio['int4_c']:5.2f} | "
                  f"{ratio['int8_torch']:5.2f} {ratio['int4_torch']:5.2f}")
    return out


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("model", nargs="?", default=None, type=model_path)
    parser.add_argument("--schemes", type=scheme_list(RTN_SCHEMES), default="W8A16,W4A16,W8A8,FP8_DYNAMIC")
    parser.add_argument("--group-size", type=positive_int, default=128)
    parser.add_argument("--prefill-tokens", type=positive_int, default=512)
    parser.add_argument("--decode-steps", type=positive_int, default=16,
                        help="decode steps a variant is timed for in each round")
    parser.add_argument("--warm-steps", type=bounded_int(0), default=16,
                        help="decode steps a variant runs untimed before them, each round "
                             "(see interleaved_decode_ms)")
    parser.add_argument("--decode-prompt", type=positive_int, default=128,
                        help="tokens before the timed decode steps, the first of the prefill's")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count, default=None)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                        help="the dense model's and the activations' dtype (default: the engine's "
                             "--dtype auto here)")
    parser.add_argument("--json", type=output_file, default=None)
    parser.add_argument("--lm-head", action="store_true",
                        help="quantize the lm_head too (as `inferlab quantize --ignore` with no "
                             "names does); by default it stays dense in every variant")
    parser.add_argument("--layer-sweep", action="store_true",
                        help="also time each kernel path on the model's linear shapes by row count "
                             "(bf16)")
    args = parser.parse_args()
    if args.decode_prompt > args.prefill_tokens:
        parser.error(f"argument --decode-prompt: at most --prefill-tokens ({args.prefill_tokens}), "
                     f"got {args.decode_prompt}")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype or "auto", torch.device("cpu"))
    base_name = DENSE_NAMES[dtype]
    loaded = load_model(args.model, dtype)
    net = loaded.model
    group = largest_group(net, args.group_size)
    sweep = layer_sweep(net, group, reps=20) if args.layer_sweep and dtype == torch.bfloat16 else None
    quantized = {name: quantized_modules(net, name, group, args.lm_head)
                 for name in args.schemes}
    # what the engine runs (the lm_head too), the weights held in fp32
    use_engine_linears(net, torch.device("cpu"), dtype, narrow=False)
    dense = {n: m for n, m in net.named_modules() if measured(n, args.lm_head)}
    held = {name: modules for name, hold in (("bf16-held", rounded_to_bf16), ("gguf-held", Avx2Fp32Linear.narrow_to_codes))
            if (modules := held_copies(dense, hold))}
    others = {**quantized, **held}
    variants = {base_name: dense, **others}
    nets = {base_name: net, **{name: variant_net(net, modules) for name, modules in others.items()}}
    gc.freeze()  # as the engine does once built: full collections would otherwise dominate
    atexit.register(gc.unfreeze)  # triton (imported by torch) checks for leaks at exit
    ids = torch.randint(100, loaded.config.vocab_size, (args.prefill_tokens,),
                        generator=torch.Generator().manual_seed(0))
    results = {name: {"prefill_ms": [], "decode_ms": []} for name in variants}
    for round_index in range(args.rounds):
        for name in in_turn(list(nets), round_index):
            results[name]["prefill_ms"].append(prefill_ms(nets[name], ids))
        steps = interleaved_decode_ms(nets, ids[: args.decode_prompt], args.decode_steps,
                                      args.warm_steps, first=round_index)
        for name, times in steps.items():
            results[name]["decode_ms"] += times
    base = {k: statistics.median(v) for k, v in results[base_name].items()}
    dense_bytes = linear_bytes(dense)
    print(f"{loaded.name}, {torch.get_num_threads()} threads, load average "
          f"{os.getloadavg()[0]:.1f}, group size {group}; medians of {args.rounds} prefills and "
          f"{args.rounds * args.decode_steps} decode steps each after {args.warm_steps} "
          f"untimed a round, "
          f"lm_head {'quantized' if args.lm_head else base_name}")
    vs = f"x {base_name}"
    print(f"{'scheme':12} {'decode ms':>10} {vs:>7} {'prefill ms':>11} {vs:>7} {'linear MB':>10} {vs:>7}")
    table = {}
    for name, modules in variants.items():
        dec = statistics.median(results[name]["decode_ms"])
        pre = statistics.median(results[name]["prefill_ms"])
        nbytes = linear_bytes(modules)
        table[name] = {"decode_ms": dec, "decode_speedup": base["decode_ms"] / dec,
                       "prefill_ms": pre, "prefill_speedup": base["prefill_ms"] / pre,
                       "linear_bytes": nbytes, "linear_bytes_ratio": nbytes / dense_bytes}
        row = table[name]
        print(f"{name:12} {dec:10.2f} {row['decode_speedup']:7.2f} {pre:11.1f} "
              f"{row['prefill_speedup']:7.2f} {nbytes / 1e6:10.1f} {row['linear_bytes_ratio']:7.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": loaded.name, "dtype": base_name, "threads": torch.get_num_threads(),
                       "group_size": group,
                       "lm_head_quantized": args.lm_head,
                       "load_average": os.getloadavg()[0], "results": table, "layer_sweep": sweep},
                      f, indent=2)


if __name__ == "__main__":
    main()
