"""config.json's compressed-tensors `quantization_config`, parsed and checked without torch, so
that `inferlab info` and `inferlab plan` read a quantized checkpoint's formats without loading it
(quant/load.py builds the layers from them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from inferlab.errors import InferlabError
from inferlab.quant.scheme import (
    INT,
    PACK_QUANTIZED,
    READABLE_FORMATS,
    QuantScheme,
    group_act_order,
    scheme_from_ct_group,
)

DENSE_SPARSITY_FORMATS = ("dense", None)


@dataclass(frozen=True)
class ConfigGroup:
    name: str
    scheme: QuantScheme
    targets: tuple[str, ...]
    format: str
    g_idx: bool = False  # group act-order: every layer must store a weight_g_idx


@dataclass(frozen=True)
class ParsedConfig:
    groups: tuple[ConfigGroup, ...]
    ignore: tuple[str, ...]

    def group_for(self, name: str) -> ConfigGroup | None:
        """The group quantizing linear layer `name` (HF name), or None when it stays dense. As
        compressed-tensors (match_targets) and vLLM (find_matched_target) pick it: a group
        naming the layer beats one matching it by regex, which beats one taking the class
        'Linear', whatever their order in the config; the first in order among equals."""
        if any(matches(name, pattern) for pattern in self.ignore):
            return None
        ranked = [(rank, i) for i, g in enumerate(self.groups)
                  if (rank := _best_rank(name, g.targets)) is not None]
        return self.groups[min(ranked)[1]] if ranked else None


def _match_rank(name: str, target: str) -> int | None:
    """0: `target` is the name; 1: a 're:' regex matching it from the start; 2: the class
    'Linear'; None: no match."""
    if target == name:
        return 0
    if target.startswith("re:"):
        return 1 if re.match(target[3:], name) is not None else None
    return 2 if target == "Linear" else None


def _best_rank(name: str, targets: tuple[str, ...]) -> int | None:
    ranks = [r for t in targets if (r := _match_rank(name, t)) is not None]
    return min(ranks, default=None)


def matches(name: str, target: str) -> bool:
    """compressed-tensors' matching: 're:' regex from the start, the class 'Linear', or the name."""
    return _match_rank(name, target) is not None


def parse_quantization_config(qc: Mapping, source: str = "quantization_config") -> ParsedConfig:
    """Validate config.json's quantization_config; anything we cannot run raises one line."""
    if qc.get("quant_method") != "compressed-tensors":
        raise InferlabError(f"{source}: quant_method {qc.get('quant_method')!r} is not supported "
                            "(supported: compressed-tensors)")
    for key in ("kv_cache_scheme", "transform_config"):
        if qc.get(key):
            raise InferlabError(f"{source}: {key} is not supported")
    sparsity = qc.get("sparsity_config") or {}
    if not isinstance(sparsity, Mapping):
        raise InferlabError(f"{source}: sparsity_config must be an object, got {sparsity!r}")
    if sparsity.get("format") not in DENSE_SPARSITY_FORMATS:
        raise InferlabError(f"{source}: sparsity format {sparsity.get('format')!r} is not supported "
                            "(sparse weights must be stored dense)")
    groups_raw = qc.get("config_groups") or {}
    if not isinstance(groups_raw, Mapping):
        raise InferlabError(f"{source}: config_groups must be an object")
    groups = []
    for name, group in groups_raw.items():
        where = f"{source}: config_groups.{name}"
        scheme = scheme_from_ct_group(group, where)
        fmt = group.get("format") or qc.get("format")
        if fmt in (None, "mixed-precision", "dense"):
            fmt = scheme.format
        if fmt not in READABLE_FORMATS:  # as loading refuses it, so that `info` does too
            raise InferlabError(f"{where}: format {fmt!r} is not supported "
                                f"(supported: {', '.join(READABLE_FORMATS)})")
        if fmt == PACK_QUANTIZED and scheme.weights.kind != INT:  # its codes were read as ints
            raise InferlabError(f"{where}: format {PACK_QUANTIZED!r} holds int weights, not "
                                f"{scheme.weights.kind!r} ones")
        targets = group.get("targets") or []
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise InferlabError(f"{where}: targets must be a list of names")
        groups.append(ConfigGroup(name, scheme, tuple(targets), fmt,
                                  group_act_order(group["weights"], where)))
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(name, str) for name in ignore):
        raise InferlabError(f"{source}: ignore must be a list of names, got {ignore!r}")
    return ParsedConfig(tuple(groups), tuple(ignore))
