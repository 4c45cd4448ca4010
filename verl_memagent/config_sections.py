"""Checks shared by the config sections the plugin adds (agent settings, `algorithm.multi_context`,
`trainer.trajectories`): each error names the key and what it accepts, so a typo fails at start-up
instead of being ignored for a whole run. A leaf: it imports nothing of ours."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import fields


def reject_unknown_keys(where: str, given: Iterable[str], schema: type) -> None:
    """A ValueError naming `where`'s keys that the dataclass `schema` does not have, and the ones it has."""
    known = {f.name for f in fields(schema)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known keys: {sorted(known)}")


def require_choice(where: str, value: object, choices: Collection) -> None:
    """A ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{where}: expected one of {list(choices)}, got {value!r}")
