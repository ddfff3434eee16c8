"""vLLM's grouped guide: SamplingParams(structured_outputs=StructuredOutputsParams(...)), or its
older name GuidedDecodingParams with guided_decoding=, read onto SamplingParams' own guide fields
so that one code path runs guides."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferlab.engine.field_types import check_field_types
from inferlab.errors import InvalidParameterError


@dataclass(frozen=True)
class StructuredOutputsParams:
    """vLLM's grouped guide, SamplingParams(structured_outputs=StructuredOutputsParams(...)) (its
    older GuidedDecodingParams and guided_decoding=): one of the guides at most, as vLLM rules,
    each onto SamplingParams' own field, so that one code path runs guides."""

    json: str | dict[str, Any] | bool | None = None  # json_schema; a schema or its JSON text
    regex: str | None = None  # guided_regex
    choice: list[str] | None = None  # guided_choice
    grammar: str | None = None  # guided_grammar
    json_object: bool | None = None  # json_object
    structural_tag: str | dict[str, Any] | None = None  # structural_tag; vLLM's is its JSON text
    disable_any_whitespace: bool = False
    # one guide implementation here, which never falls back: what True asks for, always
    disable_fallback: bool = False
    # vLLM's options the guides here have no way to honour: refused when set (_NOT_HONOURED)
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    backend: str | None = None  # GuidedDecodingParams'

    def __post_init__(self) -> None:
        check_field_types(self)
        # vLLM counts a field that is not None, json_object=False too
        kinds = [name for name in _GROUPED_GUIDES if getattr(self, name) is not None]
        if len(kinds) > 1:
            raise InvalidParameterError(f"StructuredOutputsParams takes one kind of guide, got "
                                        f"{' and '.join(kinds)}")
        for f in dataclasses.fields(self):
            if f.name in _NOT_HONOURED and getattr(self, f.name) != f.default:
                raise InvalidParameterError(
                    f"StructuredOutputsParams {f.name} is not supported by inferlab's guides "
                    f"(leave it {f.default!r})")

    def guide_fields(self) -> dict[str, Any]:
        """SamplingParams' fields for this guide (those it sets)."""
        fields = {_GROUPED_GUIDES[name]: _json_text(name, value) if name in ("json", "structural_tag")
                  else value for name in _GROUPED_GUIDES if (value := getattr(self, name)) is not None}
        return fields | ({"disable_any_whitespace": True} if self.disable_any_whitespace else {})


GuidedDecodingParams = StructuredOutputsParams  # vLLM's name for it before structured outputs
# StructuredOutputsParams' guide -> SamplingParams' field for it
_GROUPED_GUIDES = {"json": "json_schema", "regex": "guided_regex", "choice": "guided_choice",
                   "grammar": "guided_grammar", "json_object": "json_object",
                   "structural_tag": "structural_tag"}
_NOT_HONOURED = ("disable_additional_properties", "whitespace_pattern", "backend")


def _json_text(name: str, value: Any) -> Any:
    """A schema or structural tag, or its JSON text (vLLM takes both)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise InvalidParameterError(f"StructuredOutputsParams {name}: the text is not JSON") from None


def as_structured_outputs(value: Any, name: str) -> StructuredOutputsParams:
    """structured_outputs (or guided_decoding) as StructuredOutputsParams: the object, or a dict
    of its fields; an unknown key is refused by name (a typo would drop the guide unnoticed)."""
    if isinstance(value, StructuredOutputsParams):
        return value
    if not isinstance(value, Mapping):
        raise InvalidParameterError(f"{name} must be a StructuredOutputsParams or a dict of its "
                                    f"fields, got {value!r}")
    known = [f.name for f in dataclasses.fields(StructuredOutputsParams)]
    unknown = sorted(set(value) - set(known), key=str)
    if unknown:
        raise InvalidParameterError(f"{name} has no field {', '.join(map(repr, unknown))} "
                                    f"(StructuredOutputsParams has {', '.join(known)})")
    return StructuredOutputsParams(**value)
