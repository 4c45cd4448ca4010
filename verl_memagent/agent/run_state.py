"""What one `run()` of an agent loop carries to each of its generate calls, as verl's `AgentData` does
for verl's own loops: kept off the loop object, so that nothing one run sets is read by another.

The request id is the trajectory's: verl's load balancer keeps the calls of one id on one server
(sticky), whose prefix cache holds the trajectory's earlier turns. With `sampling_seed`, each call's seed
is drawn from the seed, the training step, the row, the session and the call's number (`call_seed`),
so that a rollout depends on the weights and the data only (`AgentSettings.sampling_seed`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass
class RunState:
    """One run's request id, priority, verl's sampling params, and the seed parts and count of its calls."""

    request_id: str
    sampling_params: dict[str, Any]
    priority: int = 0
    seed_parts: tuple | None = None  # None: the server's own random state (no `sampling_seed`)
    calls: int = 0

    @classmethod
    def of_row(
        cls, request_id: str, sampling_params: dict[str, Any], sampling_seed: int | None, row: dict[str, Any]
    ) -> RunState:
        """The state of a run verl started for a dataset row (`run()`'s keyword arguments)."""
        seed_parts = None
        if sampling_seed is not None:  # the call's place in the run, for `call_seed`
            index = row.get("index", row.get("extra_info", {}).get("index"))
            seed_parts = (sampling_seed, row.get("global_steps"), index, row.get("session_id"))
        return cls(request_id, dict(sampling_params), int(row.get("priority", 0)), seed_parts)

    def next_call(self, max_tokens: int, stop: list[str]) -> dict[str, Any]:
        """The sampling params of the run's next generate call: verl's, its token budget and stop
        strings, and its own seed when the run is seeded."""
        params = {**self.sampling_params, "max_tokens": max_tokens, "stop": stop}
        if self.seed_parts is not None:
            params["seed"] = call_seed(*self.seed_parts, self.calls)
        self.calls += 1
        return params


def call_seed(*parts: Any) -> int:
    """A 31-bit seed from the parts' values, the same in every process and Python run."""
    digest = hashlib.sha256(repr(tuple(str(part) for part in parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
