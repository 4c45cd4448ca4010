"""Checks shared by the config sections the plugin adds (agent settings, `algorithm.multi_context`,
`trainer.trajectories`): each error names the key and what it accepts, so a typo or a wrong type
fails at start-up instead of being ignored, or read as something else, for a whole run. A leaf: it
imports nothing of ours."""

from __future__ import annotations

import types
import typing
from collections.abc import Collection, Iterable, Mapping
from dataclasses import fields
from enum import Enum
from functools import cache
from typing import Any, TypeVar

from omegaconf import OmegaConf
from pydantic import TypeAdapter, ValidationError

Section = TypeVar("Section")

#: how an error names the types of the sections' fields
_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
_CONTAINER_NAMES = {list: "a list of {}s", dict: "a mapping to {}s"}


def reject_unknown_keys(where: str, given: Iterable[str], schema: type) -> None:
    """A ValueError naming `where`'s keys that the dataclass `schema` does not have, and the ones it has."""
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys: {sorted(known)}")


def require_choice(where: str, value: object, choices: Collection | type[Enum]) -> None:
    """A ValueError unless `value` is one of `choices` (a `str` enum: one of its values)."""
    if isinstance(choices, type) and issubclass(choices, Enum):
        choices = [choice.value for choice in choices]
    if value not in choices:
        raise ValueError(f"{where}: expected one of {list(choices)}, got {value!r}")


def typed_section(where: str, section: Mapping[str, Any], schema: type[Section]) -> Section:
    """`schema(**section)` (a dataclass) once every key is one of its fields and every value has that
    field's type, strictly: `"yes"` is not a bool, `5.0` not an integer (an integer is a number). The
    error names `where`, the key and the type it takes; values of an OmegaConf section are resolved."""
    if OmegaConf.is_config(section):
        section = OmegaConf.to_container(section, resolve=True)
    reject_unknown_keys(where, section, schema)
    hints = typing.get_type_hints(schema)
    values = {}
    for key, value in section.items():
        try:
            values[key] = _adapter(hints[key]).validate_python(value, strict=True)
        except ValidationError:
            raise ValueError(f"{where}: {key}: expected {_type_name(hints[key])}, got {value!r}") from None
    return schema(**values)


@cache
def _adapter(hint) -> TypeAdapter:
    return TypeAdapter(hint)


def _type_name(hint) -> str:
    """`list[str] | None` -> "a list of strings or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in args)
    if origin in _CONTAINER_NAMES:
        item = _type_name(args[-1]).split(" ", 1)[-1]  # "a string" -> "string"
        return _CONTAINER_NAMES[origin].format(item)
    return _TYPE_NAMES.get(hint, str(hint))
