"""The fields every agent loop writes into each `AgentLoopOutput.extra_fields`, and the values of
those whose values are a fixed set: the contract between the agents (`agent/turns.py` writes them)
and their readers (the trainer and metrics in `algo/`, the rewards, evaluation records, trajectory
records, benchmarks).

A leaf module, so that `reward` and `algo`, which never import `agent`, read the same names. The
names and values are plain strings (`extra_fields[OutputField.TRAJECTORY_ID]` is
`extra_fields["trajectory_id"]`, `FinishReason.ANSWER` is `"answer"`: the fields travel through Ray,
verl's batches and JSON as they are); each comment gives the value's type and meaning. Per context
unless said "per trajectory" (the same in every context of it).
"""

from __future__ import annotations


class OutputField:
    """The names of the fields in every `AgentLoopOutput.extra_fields`."""

    TRAJECTORY_ID = "trajectory_id"  # str, per trajectory: what the per-turn estimators group by
    TURN_INDEX = "turn_index"  # int: the context's position in its trajectory, from 0
    NUM_CONTEXTS = "num_contexts"  # int, per trajectory: contexts (training samples) it has
    AGENT_NAME = "agent_name"  # str, per trajectory: the registry name (memsearcher, mem1, react)
    FINISH_REASON = "finish_reason"  # str, per trajectory: how it ended, one of `FinishReason`
    PENALISED = "penalised"  # bool, per trajectory: ended with a penalty, every reward gives 0
    # str, per trajectory: the final context's response text, what the rewards judge (verl's own
    # decoding of a list of outputs takes a mis-sized slice when an earlier context is longer); under
    # the released prompt styles its last assistant turn, opened by the prompt's `<think>` where it was
    FINAL_RESPONSE = "final_response"
    # str | None, per trajectory: the answer the rewards score, as the loop parsed it with its tags;
    # under `action_rules: released` the released reward's answer on the final context (its last box)
    FINAL_ANSWER = "final_answer"
    FINAL_FORMAT_OK = "final_format_ok"  # bool, per trajectory: the format verdict of that answer (false without one)
    CONTEXT_TOKENS = "context_tokens"  # int: prompt + response tokens of the context
    PROMPT_TOKENS = "prompt_tokens"  # int: prompt tokens of the context
    PREFILL_TOKENS = "prefill_tokens"  # int: tokens the server read over all generate calls of the context
    MEMORY_TOKENS = "memory_tokens"  # int: tokens of the memory (mem1: state) the context's prompt holds
    MEMORY_TRUNCATED = "memory_truncated"  # bool: the memory written in this context was cut to its cap
    MEMORY_WRITTEN = "memory_written"  # bool: this context wrote a memory (mem1: a state)
    TURNS = "turns"  # int: actions taken (1 a context for memsearcher and mem1; react: generate calls)
    GENERATE_S = "generate_s"  # float: seconds waiting for the server's generate calls
    SEARCH_S = "search_s"  # float: seconds waiting for the retriever
    SEARCHES = "searches"  # int: searches the context ran
    RETRIEVER_ERRORS = "retriever_errors"  # int: searches that failed for good (the model saw a failure text)
    TURN_SCORES = "turn_scores"  # list (empty): verl's per-turn score slot
    TOOL_REWARDS = "tool_rewards"  # list (empty): verl's tool-reward slot
    QUESTION = "question"  # str, per trajectory: the question as the agent read it
    TURN_LOG = "turn_log"  # list[TurnLog] (trajectories/schema.py): calls, search and memory of each turn


class FinishReason:
    """How a trajectory ended: the value of `OutputField.FINISH_REASON`, one per trajectory."""

    ANSWER = "answer"  # it answered (`action_rules: released`: a final turn whose format the released reward accepts)
    MAX_TURNS = "max_turns"  # the last turn passed without an answer
    CONTEXT_LIMIT = "context_limit"  # the context or response cap left no room to generate or for an observation
    # a memsearcher rewrite whose call hit `max_new_tokens` or left its memory unclosed, or a memory or
    # mem1 state over `memory_max_tokens` (`memory_overflow: end` or `penalty`; `truncate` goes on)
    MEMORY_OVERFLOW = "memory_overflow"
    BAD_FORMAT = "bad_format"  # `action_rules: released`: a final turn the released reward gives 0
    NO_MEMORY = "no_memory"  # memsearcher wrote no or an empty `<memory>` (`released_eval` goes on without one)
    NO_STATE = "no_state"  # mem1 with `require_state`: an action without the internal state before it
    # malformed output under `action_rules: strict` and the tag formats (agent/parsing.py)
    NO_ACTION = "no_action"  # neither a search nor an answer
    UNCLOSED_TAG = "unclosed_tag"  # an action tag (or box) opened and never closed
    SEARCH_AND_ANSWER = "search_and_answer"  # both a search and an answer
    SEVERAL_CALLS = "several_calls"  # (strict) more than one tool call
    EMPTY_QUERY = "empty_query"  # a search with a blank query
    EMPTY_ANSWER = "empty_answer"  # an answer with blank content
    BAD_TOOL_CALL = "bad_tool_call"  # a tool call that is not JSON `{"name": <tool>, "arguments": {"query": str}}`


class CallFinish:
    """Why one generate call ended: `TurnLog` calls' `finish` (trajectories/schema.py)."""

    EOS = "eos"  # the model's end-of-sequence or end-of-turn token, or the server stopped on its own
    STOP = "stop"  # a stop string (`stop` setting)
    LENGTH = "length"  # the call's token budget (`max_new_tokens`, or the room left in the context)


def _values(constants: type) -> tuple[str, ...]:
    return tuple(value for name, value in vars(constants).items() if name.isupper())


#: every field name, in the order above
OUTPUT_FIELDS: tuple[str, ...] = _values(OutputField)
#: every finish reason, in the order above
FINISH_REASONS: tuple[str, ...] = _values(FinishReason)
