"""The fields every agent loop writes into each `AgentLoopOutput.extra_fields`: the contract between
the agents (`agent/turns.py` writes them) and their readers (the trainer and metrics in `algo/`, the
rewards, evaluation records, trajectory records, benchmarks).

A leaf module, so that `reward` and `algo`, which never import `agent`, read the same names. The
names are plain strings (`extra_fields[OutputField.TRAJECTORY_ID]` is `extra_fields["trajectory_id"]`:
the fields travel through Ray, verl's batches and JSON as they are); each comment gives the value's
type and meaning. Per context unless said "per trajectory" (the same in every context of it).
"""

from __future__ import annotations


class OutputField:
    TRAJECTORY_ID = "trajectory_id"  # str, per trajectory: what the per-turn estimators group by
    TURN_INDEX = "turn_index"  # int: the context's position in its trajectory, from 0
    NUM_CONTEXTS = "num_contexts"  # int, per trajectory: contexts (training samples) it has
    AGENT_NAME = "agent_name"  # str, per trajectory: the registry name (memsearcher, mem1, react)
    FINISH_REASON = "finish_reason"  # str, per trajectory: how it ended (answer, max_turns, ...; docs/agents.md)
    PENALISED = "penalised"  # bool, per trajectory: ended with a penalty, every reward gives 0
    # str, per trajectory: the final context's response text, what the rewards judge (verl's own
    # decoding of a list of outputs takes a mis-sized slice when an earlier context is longer)
    FINAL_RESPONSE = "final_response"
    FINAL_ANSWER = "final_answer"  # str | None, per trajectory: the answer the rewards score
    FINAL_FORMAT_OK = "final_format_ok"  # bool, per trajectory: the format verdict of the answer
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


#: every field name, in the order above
OUTPUT_FIELDS: tuple[str, ...] = tuple(value for name, value in vars(OutputField).items() if name.isupper())
