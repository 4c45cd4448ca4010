"""verl's sample key `{uid}_{session}_{index}`: the one reader of the format.

verl's V1 trainers store every output of an agent loop in TransferQueue under this key: `uid` names the
prompt (the GRPO group), `session` the trajectory among the prompt's `rollout.n`, `index` the output's
position in the list the agent loop returned (its turn). A uid may hold underscores: the two numbers are
the key's last two fields. `SampleKey.parse` reads one key; `SampleKey.columns` a batch's, vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class SampleKey(NamedTuple):
    """One sample's place: its prompt group, its trajectory in the group, its turn in the trajectory."""

    uid: str
    session: int
    index: int

    @classmethod
    def parse(cls, key: str) -> SampleKey:
        """The parts of `key`; ValueError naming it when it is not verl's `{uid}_{session}_{index}`."""
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not (parts[1].isdigit() and parts[2].isdigit()):
            raise ValueError(_not_a_key(key))
        return cls(parts[0], int(parts[1]), int(parts[2]))

    @property
    def trajectory(self) -> str:
        """`{uid}_{session}`: the trajectory's name, the prefix of its samples' keys."""
        return f"{self.uid}_{self.session}"

    @classmethod
    def columns(cls, keys: Sequence[str], where: np.ndarray | None = None) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """The uids (Arrow strings), sessions and indices of `keys` (those `where` is true), parsed with Arrow's
        vectorised string kernels: the advantage step reads every key of a batch of 100k samples. ValueError
        naming the first key that is not verl's (`parse`'s)."""
        parts = pc.split_pattern(pa.array(keys, type=pa.string()), "_", max_splits=2, reverse=True)
        if where is not None:
            parts = parts.filter(pa.array(where))
        try:
            if len(parts) and pc.min(pc.list_value_length(parts)).as_py() < 3:
                raise pa.ArrowInvalid("a key with fewer than three fields")
            session = np.asarray(pc.cast(pc.list_element(parts, 1), pa.int64()))
            index = np.asarray(pc.cast(pc.list_element(parts, 2), pa.int64()))
        except pa.ArrowInvalid:
            chosen = keys if where is None else [key for key, keep in zip(keys, where, strict=True) if keep]
            bad = [key for key in chosen if not _parses(key)]
            if not bad:
                raise  # Arrow refused what `parse` reads: a number past int64
            raise ValueError(_not_a_key(bad[0])) from None
        return pc.list_element(parts, 0), session, index


def _parses(key: str) -> bool:
    try:
        SampleKey.parse(key)
    except ValueError:
        return False
    return True


def _not_a_key(key: str) -> str:
    return f"sample key {key!r} is not verl's `{{uid}}_{{session_id}}_{{index}}`"
