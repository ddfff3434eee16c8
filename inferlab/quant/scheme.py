"""What a quantized linear layer stores and computes: weight and activation arguments, by scheme name.

The names follow llm-compressor: W8A16, W8A8, W4A16, FP8_DYNAMIC. A scheme is also what a
compressed-tensors `config_groups` entry describes, so checkpoints we did not write map onto the
same dataclass (`scheme_from_ct_group`) and anything it cannot express is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferlab.errors import InferlabError

INT = "int"
FLOAT = "float"
CHANNEL, GROUP, TENSOR, BLOCK = "channel", "group", "tensor", "block"
STRATEGIES = (CHANNEL, GROUP, TENSOR, BLOCK)
GROUPED = (GROUP, BLOCK)  # a scale for each group of group_size inputs (and block_rows outputs)

PACK_QUANTIZED = "pack-quantized"  # sub-byte ints packed into int32 (weight-only schemes)
INT_QUANTIZED = "int-quantized"  # int8 weights stored as int8 (with int8 activations)
FLOAT_QUANTIZED = "float-quantized"  # fp8 e4m3 weights stored as float8_e4m3fn
NAIVE_QUANTIZED = "naive-quantized"  # like the two above, chosen by the weight dtype
READABLE_FORMATS = (PACK_QUANTIZED, INT_QUANTIZED, FLOAT_QUANTIZED, NAIVE_QUANTIZED)
# GPTQ act-order as compressed-tensors names it: "weight" ("static") reorders columns only while
# quantizing, so the stored groups stay contiguous; "group" ("dynamic", or true in old configs)
# stores a g_idx that may assign the columns to groups in any order.
STATIC_ACT_ORDER = "static"  # the first as llm-compressor writes it, and as we do
GROUP_ACT_ORDERS = ("group", "dynamic")
ACT_ORDERS = ("weight", STATIC_ACT_ORDER, *GROUP_ACT_ORDERS)


@dataclass(frozen=True)
class WeightArgs:
    """How weights are quantized: one scale per output channel, per group of inputs, or per tensor."""

    num_bits: int  # 4 or 8
    kind: str = INT  # "int" or "float" (fp8 e4m3)
    strategy: str = CHANNEL
    group_size: int | None = None  # inputs per scale, for strategies "group" and "block"
    symmetric: bool = True  # False: an integer zero point per scale (int only)
    block_rows: int | None = None  # outputs per scale, for strategy "block"
    # None or STATIC_ACT_ORDER: how GPTQ ordered the columns while quantizing, for the config
    # only, since static act-order stores the same tensors as none (we never write a g_idx)
    actorder: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in (INT, FLOAT):
            raise InferlabError(f"weight type must be int or float, got {self.kind!r}")
        allowed_bits = (4, 8) if self.kind == INT else (8,)
        if self.num_bits not in allowed_bits:
            raise InferlabError(f"{self.num_bits}-bit {self.kind} weights are not supported "
                                f"(supported: {', '.join(map(str, allowed_bits))})")
        if self.strategy not in STRATEGIES:
            raise InferlabError(f"weight strategy {self.strategy!r} is not supported "
                                f"(supported: {', '.join(STRATEGIES)})")
        if self.strategy in GROUPED and (self.group_size is None or self.group_size <= 0):
            raise InferlabError(f"group size must be a positive integer, got {self.group_size}")
        if self.strategy not in GROUPED and self.group_size not in (None, -1):
            raise InferlabError(f"a group size ({self.group_size}) needs the group strategy")
        if (self.strategy == BLOCK) != (self.block_rows is not None) or (self.block_rows or 1) <= 0:
            raise InferlabError(f"the block strategy needs positive block rows, got {self.block_rows}")
        if self.kind == FLOAT and not self.symmetric:
            raise InferlabError("fp8 weights are symmetric only")

    @property
    def qmin(self) -> int:
        return -(2 ** (self.num_bits - 1))

    @property
    def qmax(self) -> int:
        return 2 ** (self.num_bits - 1) - 1


@dataclass(frozen=True)
class ActivationArgs:
    """Activations quantized at run time, symmetric, 8 bits: each token (row) with its own scale,
    or each group of a token's inputs with its own (dynamic), or every token with one per-tensor
    scale calibrated offline (static: the checkpoint's `input_scale`, values past it clamp)."""

    kind: str  # "int" (int8) or "float" (fp8 e4m3)
    static: bool = False
    group_size: int | None = None  # dynamic, a scale for each group of this many inputs of a row

    def __post_init__(self) -> None:
        if self.kind not in (INT, FLOAT):
            raise InferlabError(f"activation type must be int or float, got {self.kind!r}")
        if self.group_size is not None and (self.static or self.group_size <= 0):
            raise InferlabError(f"activation groups must be dynamic with a positive size, got "
                                f"{self.group_size}")

    def describe(self) -> str:
        if self.static:
            return "with one static scale"
        return "per token" if self.group_size is None else f"per token in groups of {self.group_size}"

    def to_ct(self) -> dict[str, Any]:
        """compressed-tensors' `input_activations` entry."""
        strategy = TENSOR if self.static else "token" if self.group_size is None else GROUP
        return {"num_bits": 8, "type": self.kind, "symmetric": True, "group_size": self.group_size,
                "strategy": strategy, "dynamic": not self.static, "actorder": None,
                "observer": "minmax" if self.static else None}


@dataclass(frozen=True)
class QuantScheme:
    name: str
    weights: WeightArgs
    activations: ActivationArgs | None = None

    @property
    def format(self) -> str:
        """The compressed-tensors storage format vLLM expects for this scheme."""
        if self.weights.kind == FLOAT:
            return FLOAT_QUANTIZED
        return INT_QUANTIZED if self.activations is not None else PACK_QUANTIZED

    def describe(self) -> str:
        """One line for people: 'int4 weights in groups of 128, asymmetric'."""
        w = self.weights
        per = {CHANNEL: "per channel", TENSOR: "per tensor", GROUP: f"in groups of {w.group_size}",
               BLOCK: f"in blocks of {w.block_rows}x{w.group_size}"}
        text = f"{w.kind}{w.num_bits} weights {per[w.strategy]}" + ("" if w.symmetric else ", asymmetric")
        if self.activations is not None:
            text += f", {self.activations.kind}8 activations {self.activations.describe()}"
        return text

    def to_ct_group(self, targets: list[str]) -> dict[str, Any]:
        """The `config_groups` entry compressed-tensors and vLLM read."""
        w = self.weights
        weights = {"num_bits": w.num_bits, "type": w.kind, "symmetric": w.symmetric,
                   "group_size": w.group_size if w.strategy == GROUP else None,
                   "strategy": w.strategy, "dynamic": False, "actorder": w.actorder,
                   "observer": "minmax"}
        if w.strategy == BLOCK:
            weights["block_structure"] = [w.block_rows, w.group_size]
        acts = None if self.activations is None else self.activations.to_ct()
        return {"targets": targets, "weights": weights, "input_activations": acts,
                "output_activations": None, "format": self.format}


SCHEME_NAMES = ("W8A16", "W8A8", "W4A16", "FP8_DYNAMIC", "FP8", "FP8_BLOCK")
GROUP_SIZED_SCHEMES = ("W4A16", "FP8_BLOCK")
DEFAULT_GROUP_SIZE = 128


def make_scheme(name: str, group_size: int = DEFAULT_GROUP_SIZE,
                asymmetric: bool = False) -> QuantScheme:
    """A scheme by llm-compressor's name; `group_size` applies to W4A16 and FP8_BLOCK (its
    blocks' side), `asymmetric` to W4A16 and W8A16. W8A16 is per channel, the int8 kernel's
    layout (compressed-tensors 0.20.1's preset of that name has groups of 128)."""
    key = name.upper()
    if key not in SCHEME_NAMES:
        raise InferlabError(f"unknown scheme {name!r} (known: {', '.join(SCHEME_NAMES)})")
    if asymmetric and key not in ("W4A16", "W8A16"):
        raise InferlabError(f"--asymmetric applies to the weight-only schemes W4A16 and W8A16, "
                            f"not {key}")
    if key == "W4A16":
        return QuantScheme(key, WeightArgs(4, INT, GROUP, group_size, not asymmetric))
    if key == "W8A16":
        return QuantScheme(key, WeightArgs(8, INT, CHANNEL, None, not asymmetric))
    if key == "W8A8":
        return QuantScheme(key, WeightArgs(8, INT, CHANNEL), ActivationArgs(INT))
    if key == "FP8":  # llm-compressor's static preset: one weight and one input scale per layer
        return QuantScheme(key, WeightArgs(8, FLOAT, TENSOR), ActivationArgs(FLOAT, static=True))
    if key == "FP8_BLOCK":  # DeepSeek-V3's: square weight blocks, activation groups as wide
        return QuantScheme(key, WeightArgs(8, FLOAT, BLOCK, group_size, block_rows=group_size),
                           ActivationArgs(FLOAT, group_size=group_size))
    return QuantScheme(key, WeightArgs(8, FLOAT, CHANNEL), ActivationArgs(FLOAT))


def group_act_order(weights: dict[str, Any], where: str) -> bool:
    """Whether a `weights` entry says its layers carry a g_idx (group act-order); an actorder
    value we do not know raises, naming `where`."""
    value = weights.get("actorder")
    if value is None or value is False:
        return False
    if value is True:
        return True
    if not isinstance(value, str) or value.lower() not in ACT_ORDERS:
        raise InferlabError(f"{where}: actorder {value!r} is not supported "
                            f"(supported: none, {', '.join(ACT_ORDERS)})")
    return value.lower() in GROUP_ACT_ORDERS


def scheme_from_ct_group(group: dict[str, Any], where: str) -> QuantScheme:
    """A compressed-tensors `config_groups` entry -> QuantScheme; unsupported parts raise, naming `where`."""
    if not isinstance(group, dict):
        raise InferlabError(f"{where}: expected an object, got {type(group).__name__}")
    weights = group.get("weights")
    if not isinstance(weights, dict):
        raise InferlabError(f"{where}: no weight quantization (only weight-quantized linears load)")
    if group.get("output_activations"):
        raise InferlabError(f"{where}: output activation quantization is not supported")
    if weights.get("dynamic"):
        raise InferlabError(f"{where}: dynamic weight quantization is not supported")
    _check_field_types(weights, f"{where}.weights")
    strategy = weights.get("strategy") or (GROUP if (weights.get("group_size") or 0) > 0 else TENSOR)
    block = weights.get("block_structure") if strategy == BLOCK else [None, None]
    if not (isinstance(block, list) and len(block) == 2):
        raise InferlabError(f"{where}: block weights need a block_structure [rows, columns], got {block!r}")
    try:
        w = WeightArgs(num_bits=8 if weights.get("num_bits") is None else weights["num_bits"],
                       kind=weights.get("type") or INT,
                       strategy=strategy,
                       group_size=weights.get("group_size") if strategy == GROUP else block[1],
                       symmetric=bool(weights.get("symmetric", True)), block_rows=block[0])
    except InferlabError as e:
        raise InferlabError(f"{where}: {e}") from None
    acts = group.get("input_activations")
    if not acts:
        return QuantScheme("custom", w)
    if not isinstance(acts, dict):
        raise InferlabError(f"{where}: input_activations must be an object, got {acts!r}")
    _check_field_types(acts, f"{where}.input_activations")
    return QuantScheme("custom", w, _activations_from_ct(acts, w, where))


# the QuantizationArgs fields read here, by the JSON type compressed-tensors writes them in
_FIELD_TYPES = {"num_bits": int, "group_size": int, "symmetric": bool, "dynamic": bool,
                "type": str, "strategy": str, "actorder": (str, bool)}


def _check_field_types(args: dict[str, Any], where: str) -> None:
    """A field of another type ("num_bits": "4bit") is named here rather than failing later
    as a traceback."""
    for key, kind in _FIELD_TYPES.items():
        value = args.get(key)
        wrong_int = kind is int and isinstance(value, bool)
        if value is not None and (not isinstance(value, kind) or wrong_int):
            raise InferlabError(f"{where}.{key}: {value!r} is not of the type it takes")


def _activations_from_ct(acts: dict[str, Any], w: WeightArgs, where: str) -> ActivationArgs:
    """Per token or per group of a token's inputs (dynamic), or per tensor (static)."""
    dynamic, strategy = acts.get("dynamic"), acts.get("strategy")
    static = dynamic is False and strategy == TENSOR
    grouped = dynamic is True and strategy == GROUP
    if not (static or grouped or (dynamic is True and strategy == "token")):
        raise InferlabError(f"{where}: activations must be quantized per token or per group of its "
                            f"inputs (dynamic), or per tensor (static), got strategy {strategy!r}, "
                            f"dynamic {dynamic!r}")
    if int(acts.get("num_bits", 8)) != 8 or not acts.get("symmetric", True):
        raise InferlabError(f"{where}: activations must be 8-bit symmetric")
    if w.num_bits != 8 or not w.symmetric:
        raise InferlabError(f"{where}: quantized activations need 8-bit symmetric weights")
    if grouped and (w.strategy not in GROUPED or acts.get("group_size") != w.group_size):
        raise InferlabError(f"{where}: activations in groups of {acts.get('group_size')} need weights "
                            "in groups or blocks as wide")
    if not grouped and w.strategy in GROUPED:
        raise InferlabError(f"{where}: weights in groups or blocks need activations in groups as wide")
    kind = acts.get("type", INT)
    if kind != w.kind:
        raise InferlabError(f"{where}: {kind} activations with {w.kind} weights are not supported")
    return ActivationArgs(kind, static, w.group_size if grouped else None)
