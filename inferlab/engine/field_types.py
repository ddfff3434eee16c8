"""A dataclass's fields checked against their annotations, for the parameter objects users build."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np

from inferlab.errors import InvalidParameterError


def check_field_types(params: Any) -> None:
    """Each int field of the dataclass `params` an int (not a bool, not 2.5), each float field a
    real number and each bool field a bool, by the fields' annotations: a wrong type passes the
    range checks and once failed in the middle of a step (a float seed in the generator, a float
    logprobs in topk), which ends an AsyncEngine's loop for every request, or ran silently
    (ignore_eos="no", true)."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if value is None and f.type.endswith("| None"):
            continue
        kind = f.type.removesuffix(" | None")
        if kind == "int" and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
            raise InvalidParameterError(f"{f.name} must be an integer, got {value!r}")
        if kind == "float" and (not isinstance(value, numbers.Real) or isinstance(value, bool)):
            raise InvalidParameterError(f"{f.name} must be a number, got {value!r}")
        if kind == "bool" and not isinstance(value, bool | np.bool_):  # numpy's, as its ints pass
            raise InvalidParameterError(f"{f.name} must be true or false, got {value!r}")
