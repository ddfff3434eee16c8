"""Which model a command names: its path and display name. Torch-free, so that a command line
naming no model there is refused before torch loads (seconds)."""

from __future__ import annotations

import os

from inferlab.errors import ModelLoadError
from inferlab.models.embedded import EMBEDDED_ALIAS, EMBEDDED_MODEL_NAME, embedded_model_path
from inferlab.user_files import stat_user_path


def resolve_model_path(model: str | None) -> str:
    embedded = model is None or (model == EMBEDDED_ALIAS and not os.path.exists(model))
    path = embedded_model_path() if embedded else os.path.expanduser(model)
    if not path:
        raise ModelLoadError("the model path is empty: name a model directory or .gguf file, or "
                             "leave it out for the embedded model")
    if stat_user_path(path) is None:
        raise ModelLoadError(f"{path}: no such file or directory")
    return path


def model_display_name(model: str | None) -> str:
    if model is None or model == EMBEDDED_ALIAS:
        return EMBEDDED_MODEL_NAME
    return os.path.basename(os.path.normpath(model))
