"""A played trajectory as verl's `AgentLoopOutput`s: one per context (one training sample), in turn
order, each tagged with the trajectory id and turn index the per-turn estimators group by and the
fields of `output_fields.OutputField`, its turn log (`trajectories.schema.TurnLog`) among them."""

from __future__ import annotations

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from verl_memagent.agent.trajectory import Context, Trajectory
from verl_memagent.output_fields import OutputField
from verl_memagent.trajectories.schema import TurnLog


def agent_outputs(
    trajectory: Trajectory, agent: str, tokenizer, end_ids: list[int], one_output_per_context: bool
) -> list[AgentLoopOutput]:
    """One AgentLoopOutput per context of the trajectory `agent` played. A context whose server returned
    no token gets `end_ids` (masked): verl needs one response position for the reward."""
    for context in trajectory.contexts:
        if not context.response_ids:
            context.add_inserted(list(end_ids))
    final_response = tokenizer.decode(trajectory.contexts[-1].response_ids, skip_special_tokens=True)
    answer = trajectory.answer
    outputs = []
    for index, context in enumerate(trajectory.contexts):
        extra_fields = {
            **context.server_fields,
            OutputField.TRAJECTORY_ID: trajectory.id,
            OutputField.TURN_INDEX: index,
            OutputField.NUM_CONTEXTS: len(trajectory.contexts),
            OutputField.AGENT_NAME: agent,
            OutputField.FINISH_REASON: trajectory.finish_reason,
            OutputField.PENALISED: trajectory.penalised,
            OutputField.FINAL_RESPONSE: final_response,
            OutputField.FINAL_ANSWER: answer.answer if answer else None,
            OutputField.FINAL_FORMAT_OK: bool(answer and answer.format_ok),
            OutputField.CONTEXT_TOKENS: context.length,
            OutputField.PROMPT_TOKENS: len(context.prompt_ids),
            OutputField.PREFILL_TOKENS: context.prefill_tokens,
            OutputField.MEMORY_TOKENS: context.memory_tokens,
            OutputField.MEMORY_TRUNCATED: context.memory_truncated,
            OutputField.MEMORY_WRITTEN: context.memory_written,
            OutputField.TURNS: 1 if one_output_per_context else context.generate_calls,
            OutputField.GENERATE_S: context.generate_s,
            OutputField.SEARCH_S: context.search_s,
            OutputField.SEARCHES: context.searches,
            OutputField.RETRIEVER_ERRORS: context.retriever_errors,
            OutputField.TURN_SCORES: [],
            OutputField.TOOL_REWARDS: [],
            OutputField.QUESTION: trajectory.question,
            OutputField.TURN_LOG: turn_log(context, one_output_per_context),
        }
        outputs.append(
            AgentLoopOutput(
                prompt_ids=context.prompt_ids,
                response_ids=context.response_ids,
                response_mask=context.response_mask,
                response_logprobs=context.response_logprobs or None,
                num_turns=1 + context.generate_calls + context.searches,
                metrics=AgentLoopMetrics(generate_sequences=context.generate_s, tool_calls=context.search_s),
                extra_fields=extra_fields,
            )
        )
    return outputs


def turn_log(context: Context, one_turn_per_context: bool) -> list[TurnLog]:
    """The turns of one context: one holding all its calls (memsearcher, mem1), or one per call (react);
    a search belongs to the turn of the call before it, the memory to the context's last turn."""
    calls = context.calls
    groups = [list(range(len(calls)))] if one_turn_per_context else [[i] for i in range(len(calls))]
    groups = groups or [[]]  # no call at all: the context had no room left
    searches = {made - 1: search for made, search in context.search_log}
    return [
        TurnLog(
            calls=[calls[i] for i in members],
            search=next((searches[i] for i in members if i in searches), None),
            memory_before=context.memory_before,
            memory=context.memory if number == len(groups) - 1 else None,
        )
        for number, members in enumerate(groups)
    ]
