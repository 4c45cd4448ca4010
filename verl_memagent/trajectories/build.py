"""A trajectory's record from its agent loop outputs: the turn logs read, the tokens decoded.

The agent loops keep per-sample bookkeeping small (`extra_fields["turn_log"]`: token positions,
query, passage ids and titles, memories); texts are decoded here, for the sampled trajectories only,
from the very token ids the model saw and sampled. The same builder serves the trainer (contexts read
back from TransferQueue, with the advantages it used) and `verl-memagent eval` (the outputs of `run()`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from verl_memagent.output_fields import OutputField
from verl_memagent.trajectories.retention import Retention, retention
from verl_memagent.trajectories.schema import CallSpan, ModelCall, Passage, Source, TrajectoryRecord, Turn


@dataclass(frozen=True)
class ContextSample:
    """One LLM context (one training sample) of a trajectory: its tokens, the agent's fields and, in
    training, the per-response-token advantages the trainer used."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    extra_fields: Mapping[str, Any]
    key: str | None = None
    advantages: Sequence[float] | None = None


def is_recorded(extra_fields: Any) -> bool:
    """Whether an output carries the turn log of this package's agent loops (verl's own loops do not)."""
    return (
        isinstance(extra_fields, Mapping)
        and OutputField.TURN_LOG in extra_fields
        and OutputField.TRAJECTORY_ID in extra_fields
    )


def plain(value: Any) -> Any:
    """`value` with numpy arrays and scalars (as TransferQueue and parquet hand them out) made JSON-ready."""
    if isinstance(value, np.ndarray):
        return [plain(item) for item in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def _model_call(tokenizer, token_ids: np.ndarray, span: CallSpan) -> ModelCall:
    start, end = min(span["start"], len(token_ids)), min(span["end"], len(token_ids))
    return ModelCall(
        context=tokenizer.decode(token_ids[:start], skip_special_tokens=False),
        context_tokens=start,
        output=tokenizer.decode(token_ids[start:end], skip_special_tokens=False),
        output_tokens=end - start,
        finish=span["finish"],
    )


def _sampled_advantages(sample: ContextSample, spans: Sequence[CallSpan]) -> np.ndarray:
    """The advantages at the spans' sampled tokens (advantages are indexed by response position)."""
    if sample.advantages is None:
        return np.zeros(0)
    advantages, offset = np.asarray(sample.advantages, dtype=np.float64), len(sample.prompt_ids)
    return np.concatenate([np.zeros(0), *(advantages[s["start"] - offset : s["end"] - offset] for s in spans)])


def _weight_versions(extra_fields: Mapping[str, Any]) -> list[int] | None:
    """[first, last] weight version of a context's generate calls, as verl's rollout server reports them
    (`min_global_steps`, `max_global_steps`); None where it reports none."""
    versions = [extra_fields.get("min_global_steps"), extra_fields.get("max_global_steps")]
    return None if None in versions else [int(version) for version in versions]


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def retained_counts(turn: Retention | None) -> dict[str, int | None]:
    """A turn's memory-retention fields of its record (none where the turn wrote no memory)."""
    if turn is None:
        return {}
    return {
        "answers_read": turn.read,
        "answers_held": turn.held,
        "statements_read": turn.statements_read,
        "statements_held": turn.statements_held,
    }


def build_record(
    contexts: Sequence[ContextSample],
    tokenizer,
    *,
    source: Source,
    step: int | None,
    data_source: str,
    golden_answers: Any,
    reward: float | None,
    reward_info: Mapping[str, Any] | None = None,
    uid: str | None = None,
    session: int | None = None,
    row_id: Any = None,
) -> TrajectoryRecord:
    """The record of one trajectory from all its contexts in turn order (every one `is_recorded`)."""
    final = contexts[-1].extra_fields
    whole = final.get(OutputField.NUM_CONTEXTS, len(contexts))
    if int(whole) != len(contexts):
        raise ValueError(f"{len(contexts)} of the trajectory's {whole} contexts: a record is of a whole trajectory")
    turns: list[Turn] = []
    sampled: list[np.ndarray] = []
    logs = [log for sample in contexts for log in sample.extra_fields[OutputField.TURN_LOG]]
    question = str(final[OutputField.QUESTION])
    retained = {r.turn: r for r in retention(logs, golden_answers, question)} if golden_answers is not None else {}
    for context_index, sample in enumerate(contexts):
        # an array: transformers turns it into a list in C, where a list of ints is checked item by item
        token_ids = np.concatenate([np.asarray(sample.prompt_ids, np.int64), np.asarray(sample.response_ids, np.int64)])
        for log in sample.extra_fields[OutputField.TURN_LOG]:
            spans, search = log["calls"], log["search"]
            advantages = _sampled_advantages(sample, spans)
            sampled.append(advantages)
            turns.append(
                Turn(
                    index=len(turns),
                    context_index=context_index,
                    sample_key=sample.key,
                    context_tokens=min(spans[-1]["end"], len(token_ids)) if spans else len(sample.prompt_ids),
                    calls=[_model_call(tokenizer, token_ids, span) for span in spans],
                    query=search["query"] if search else None,
                    passages=[Passage(**passage) for passage in search["passages"]] if search else [],
                    search_failed=bool(search and search["failed"]),
                    memory_before=log["memory_before"],
                    memory=log["memory"],
                    **retained_counts(retained.get(len(turns))),
                    advantage=_mean(advantages),
                    weight_versions=_weight_versions(sample.extra_fields),
                )
            )
    return TrajectoryRecord(
        source=source,
        step=step,
        agent=str(final[OutputField.AGENT_NAME]),
        data_source=str(data_source),
        question=question,
        golden_answers=plain(golden_answers),
        answer=final.get(OutputField.FINAL_ANSWER),
        finish_reason=str(final[OutputField.FINISH_REASON]),
        penalised=bool(final[OutputField.PENALISED]),
        reward=None if reward is None else float(reward),
        reward_info=plain(dict(reward_info or {})),
        advantage=_mean(np.concatenate([np.zeros(0), *sampled])),
        trajectory_id=str(final[OutputField.TRAJECTORY_ID]),
        uid=uid,
        session=session,
        row_id=plain(row_id),
        turns=turns,
    )
