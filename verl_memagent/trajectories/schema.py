"""The trajectory record: one JSON line per trajectory, the same from training, validation and eval.

Two layers, both defined here so that writer and readers share one definition:

- `TurnLog` (TypedDicts): what an agent loop writes into each output's `extra_fields["turn_log"]`,
  cheap enough for every sample of every step: token positions of its generate calls, the search it
  made (query, passage ids and titles), the memory it started from and the one it wrote.
- `TrajectoryRecord` (pydantic): the readable record built from those outputs for the sampled
  trajectories only (`verl_memagent.trajectories.build`): the texts decoded, reward and advantage
  attached. Reading a file validates every line against it, so a bad field is named with its line.

A leaf module (stdlib and pydantic): the agent loops, `algo` and `eval` all import it.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 3  # 3: a turn's memory retention by statements (statements_read, statements_held)

#: where a record comes from: a training step, a validation, or `verl-memagent eval`
Source = Literal["train", "validation", "eval"]


# ---- what the agent loops write (extra_fields["turn_log"], one list per output) ------------------


class CallSpan(TypedDict):
    """One generate call: its sampled tokens are `token_ids[start:end]` of the context (prompt + response)."""

    start: int
    end: int
    finish: str  # a `CallFinish` (output_fields.py): "eos", "stop" (a stop string) or "length"


class PassageRef(TypedDict):
    """A passage a search returned, as the turn log keeps it."""

    id: str
    title: str


class SearchLog(TypedDict):
    """One search of a turn: its query and what came back."""

    query: str
    passages: list[PassageRef]  # in the retriever's order; empty when the search failed
    failed: bool
    text: str  # what the model was shown (the documents as formatted and capped, or the failure message)


class TurnLog(TypedDict):
    """One turn inside one context: memsearcher and mem1 have one per context, react one per generate call."""

    calls: list[CallSpan]  # the action first; memsearcher's memory rewrite after it
    search: SearchLog | None
    memory_before: str | None  # the memory (MEM1: internal state) the turn's context holds; None: no memory
    memory: str | None  # the memory (state) written in this turn, after its cap; None: none written


# ---- the record (JSON lines under <run dir>/trajectories/) ---------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Passage(_Record):
    """A passage a turn's search returned."""

    id: str
    title: str


class ModelCall(_Record):
    """One generate call: the context the model saw, and what it sampled from there."""

    context: str  # the context's tokens decoded with special tokens: exactly what the model attended to
    context_tokens: int
    output: str
    output_tokens: int
    finish: str  # a `CallFinish` (output_fields.py): eos, stop or length


class Turn(_Record):
    """One turn of a trajectory: its generate calls, search and memories, in the context that holds it."""

    index: int  # 0-based turn number in the trajectory
    context_index: int  # which of the trajectory's LLM contexts (training samples) holds it
    sample_key: str | None  # verl's key of that sample, `{uid}_{session}_{context_index}` (None in eval)
    context_tokens: int  # the context's length at the end of the turn's last generation (eval's definition)
    calls: list[ModelCall]  # the action first; memsearcher's memory rewrite after it; empty: no room left
    query: str | None
    passages: list[Passage]
    search_failed: bool
    memory_before: str | None
    memory: str | None
    # memory retention (trajectories/retention.py), on turns that wrote a memory: objectives whose answer
    # the searches had shown before the memory was written, and how many of them the memory holds
    answers_read: int | None = None
    answers_held: int | None = None
    # the same by statements: an objective's answer with every content word of its own question in one
    # sentence (trajectories/retention.py); None where the question's objectives cannot be told apart
    statements_read: int | None = None
    statements_held: int | None = None
    advantage: float | None  # mean over the turn's sampled tokens, as the trainer used them (training only)
    # [first, last] weight version (the trainer step whose update made the weights) of the generate calls of
    # the context holding the turn, as verl's rollout server reports them; None where none is reported
    weight_versions: list[int] | None = None


class TrajectoryRecord(_Record):
    """One trajectory as a readable record: one JSON line (docs/trajectories.md)."""

    schema_version: int = SCHEMA_VERSION
    source: Source
    step: int | None  # the trainer's global step (0: validation before training); None in eval
    agent: str
    data_source: str
    question: str
    golden_answers: Any  # the row's ground truth: a list of answers, or one list per objective (MEM1)
    answer: str | None  # the final answer the agent recorded (what the reward scored); None: no answer
    finish_reason: str
    penalised: bool
    reward: float | None  # the reward function's score (eval: EM); None when it was not computed
    reward_info: dict[str, Any]  # the reward function's extra values (eval: em, f1, acc, ...)
    advantage: float | None  # mean over all sampled tokens of the trajectory (training only)
    trajectory_id: str  # the agent loop's id, `extra_fields["trajectory_id"]`
    uid: str | None  # verl's prompt uid: the GRPO group
    session: int | None  # the trajectory's index among the group's rollouts
    row_id: Any  # the dataset row's `extra_info.id` (else its index)
    turns: list[Turn]
