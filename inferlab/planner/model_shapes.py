"""The model to plan for: a Hugging Face directory, a GGUF file, a preset name, or the embedded
model. Only shapes are read (config.json, or GGUF metadata through the models package's
torch-free reader), never the weights."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from inferlab.errors import InferlabError, ModelLoadError
from inferlab.models.config import ModelConfig, read_json_object
from inferlab.models.embedded import EMBEDDED_MODEL_NAME, embedded_model_path
from inferlab.models.gguf import read_gguf_config
from inferlab.models.gguf_reader import is_gguf_file
from inferlab.planner.memory import ASYMMETRIC, WeightFormat
from inferlab.planner.names import closest_names
from inferlab.planner.presets import PRESETS, preset_config
from inferlab.quant.ct_config import ConfigGroup, parse_quantization_config
from inferlab.quant.scheme import BLOCK, FLOAT, GROUP, GROUPED, TENSOR, QuantScheme
from inferlab.user_files import check_readable, is_user_file, stat_user_path


@dataclass(frozen=True)
class ModelSpec:
    name: str
    config: ModelConfig
    source: str  # the file read, or the URL of the preset's config.json


def _read_config_json(path: Path) -> ModelConfig:
    return ModelConfig.from_hf_dict(read_json_object(str(path)), source=str(path))


def resolve_model(model: str | None) -> ModelSpec:
    """None -> the embedded model; an existing path -> its config; otherwise a preset name."""
    if model is None:
        path = Path(embedded_model_path())
        return ModelSpec(f"{EMBEDDED_MODEL_NAME} (embedded)", read_gguf_config(str(path)), str(path))
    path = Path(model).expanduser()
    found = stat_user_path(path)  # a folder we may not search: "Permission denied", no traceback
    if found is not None and stat.S_ISDIR(found.st_mode):
        if not is_user_file(path / "config.json"):
            raise ModelLoadError(f"{path}: a model directory needs a config.json")
        return ModelSpec(path.name, _read_config_json(path / "config.json"), str(path / "config.json"))
    if found is not None and stat.S_ISREG(found.st_mode):
        check_readable(path)
        if is_gguf_file(str(path)):
            return ModelSpec(path.stem, read_gguf_config(str(path)), str(path))
        return ModelSpec(path.parent.name or path.stem, _read_config_json(path), str(path))
    if any(k.lower() == model.lower() for k in PRESETS):
        name, cfg, source = preset_config(model)
        return ModelSpec(name, cfg, source)
    close = closest_names(model, PRESETS)
    hint = f"did you mean {', '.join(close)}?" if close else f"presets: {', '.join(PRESETS)}"
    raise InferlabError(f"model {model!r} is neither a file, a directory nor a preset; {hint}")


def scheme_weight_format(scheme: QuantScheme) -> WeightFormat:
    """A compressed-tensors scheme as the planner costs it: quantized activations run the matmuls
    at their 8-bit rate; weight-only schemes dequantize inside a bf16 matmul. Scales as the
    strategy lays them out: per output row (channel), per group of a row's inputs, per block,
    or one for the whole layer (tensor)."""
    w, acts = scheme.weights, scheme.activations
    group = w.group_size if w.strategy in GROUPED else None
    rows = {TENSOR: None, BLOCK: w.block_rows}.get(w.strategy, 1)
    compute = "bf16" if acts is None else "fp8" if acts.kind == FLOAT else "int8"
    layout = {TENSOR: "-tensor", BLOCK: f"-b{rows}x{group}", GROUP: f"-g{group}"}.get(w.strategy, "")
    name = (f"{'fp' if w.kind == FLOAT else 'int'}{w.num_bits}{layout}"
            + ("-wo" if acts is None and w.num_bits == 8 else "") + ("" if w.symmetric else ASYMMETRIC))
    return WeightFormat(name, w.num_bits, group, True, compute, symmetric=w.symmetric,
                        scale_rows=rows, input_scales=acts is not None and acts.static)


def checkpoint_weight_format(spec: ModelSpec) -> WeightFormat | None:
    """The format a compressed-tensors checkpoint stores its linears in, None if it is not one;
    read as `inferlab info` and the loader read it, so a config they refuse fails here too."""
    config = spec.config.extra.get("quantization_config")
    if not config:
        return None
    try:
        parsed = parse_quantization_config(config, spec.source)
    except InferlabError as e:
        raise InferlabError(f"{e}; plan it with --weight-format") from None
    return groups_weight_format(parsed.groups, spec.source, parsed.ignore)


def groups_weight_format(groups: Sequence[ConfigGroup], source: str,
                         ignore: Sequence[str] = ("lm_head",)) -> WeightFormat | None:
    """The one format compressed-tensors `groups` store the linears they target in, but those
    `ignore` names (None: no group)."""
    formats = {scheme_weight_format(g.scheme) for g in groups}
    if len(formats) > 1:
        names = ", ".join(sorted(f.name for f in formats))
        raise InferlabError(f"{source}: the checkpoint mixes weight formats ({names}); "
                            "choose one with --weight-format")
    if not formats:
        return None
    targets = tuple(dict.fromkeys(t for g in groups for t in g.targets))
    return replace(formats.pop(), targets=targets, ignore=tuple(ignore))
