"""MemSearcher: each turn sees only the question and a memory the model rewrites after every search.

Turn t's context: system prompt (with the search tool's schema) + user message holding the question
and memory M_{t-1} (empty at first). The model thinks, then answers with `\\boxed{}` or calls the
search tool. After a search the documents come back as a tool message plus an instruction to rewrite
the memory (all masked), and the model writes `<memory> M_t </memory>` in the same context. The next
turn starts from a fresh context with the question and M_t. One context = one training sample:
prompt = the rendered context, response = action + (masked) tool response + memory.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register

from verl_memagent.agent.parsing import parse_memory, parse_tool_call_action
from verl_memagent.agent.turns import Context, SearchAgentLoop, Trajectory


def search_tool_schema(name: str) -> dict[str, Any]:
    """OpenAI function schema of the search tool, rendered into the system turn by the chat template."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "Search Wikipedia; returns the most relevant passages.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to search for"}},
                "required": ["query"],
            },
        },
    }


@register("memsearcher")
class MemSearcherAgentLoop(SearchAgentLoop):
    agent = "memsearcher"
    stop_tags = ("tool_call", "memory")
    default_tags = {"think": "think", "tool_call": "tool_call", "question": "question", "memory": "memory"}

    async def rollout(self, trajectory: Trajectory, question: str, sampling_params: dict[str, Any]) -> None:
        tools = [search_tool_schema(self.settings.tool_name)]
        max_turns = self.settings.max_turns
        memory = ""
        for turn in range(max_turns):
            last_turn = turn == max_turns - 1
            user = self.prompts.render(
                "user", question=question, memory=memory, turns_left=max_turns - turn, last_turn=last_turn
            )
            messages = [{"role": "system", "content": self.prompts.render("system")}, {"role": "user", "content": user}]
            prompt_ids = await self.ct_build_initial_tokens(messages, tools=tools)
            context = Context(prompt_ids=prompt_ids, memory_tokens=len(self.encode(memory)))
            trajectory.contexts.append(context)

            action_gen = await self.generate(context, sampling_params)
            if action_gen is None:
                return trajectory.finish("context_limit")
            action = parse_tool_call_action(action_gen.text, self.settings.tool_name, self.tags["tool_call"])
            if action.kind == "answer":
                return trajectory.finish("answer")
            if action.kind == "invalid":
                return trajectory.finish(action.reason)
            if last_turn:
                return trajectory.finish("max_turns")

            documents = await self.search(context, action.query)
            history = [*messages, {"role": "assistant", "content": action_gen.text}]
            update = self.prompts.render("memory_update")
            new_messages = [{"role": "tool", "content": documents}, {"role": "user", "content": update}]
            if not await self.insert_messages(context, history, new_messages, tools=tools):
                return trajectory.finish("context_limit")

            memory_gen = await self.generate(context, sampling_params)
            if memory_gen is None:
                return trajectory.finish("context_limit")
            new_memory, closed = parse_memory(memory_gen.text, self.tags["memory"])
            if new_memory is None:
                return trajectory.finish("no_memory")
            context.memory_written = True
            overflow = not closed and memory_gen.finish == "length"
            memory, _, truncated = self.truncate(new_memory, self.settings.memory_max_tokens)
            if (overflow or truncated) and self.settings.memory_overflow == "penalty":
                return trajectory.finish("memory_overflow", penalised=True)
            context.memory_truncated = truncated
