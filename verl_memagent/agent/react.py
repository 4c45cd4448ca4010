"""ReAct: the baseline that keeps the whole history in one growing context.

With the released prompt styles it is MemSearcher's own ReAct baseline (ReCall, in MemSearcher's
`memsearcher/inference/memsearcher.py`) with MemSearcher's tool schema, action and answer format
(`<tool_call>` JSON, `\\boxed{}`), documents and turn opening (`<think>`): against `memsearcher` only
the context management differs. The model reasons, calls the search tool, reads the tool response
appended to its own context (masked) and eventually answers. One trajectory is one context and one
training sample, so its prompt grows with every search.

With `prompt_style: ours` it is the Search-R1 format: `<search> q </search>`, the documents in
`<information> </information>`, the answer in `<answer> </answer>`.
"""

from __future__ import annotations

from collections.abc import Sequence

from verl_memagent.agent.parsing import Action, parse_tag_action
from verl_memagent.agent.run_state import RunState
from verl_memagent.agent.settings import PromptStyle
from verl_memagent.agent.tool_calls import RELEASED_FORMAT, ToolCallAgentLoop
from verl_memagent.agent.trajectory import Context, ToolCall, Trajectory, TurnFormat
from verl_memagent.output_fields import FinishReason


class ReactAgentLoop(ToolCallAgentLoop):
    """`react`: the baseline whose one context grows with every search (module docstring)."""

    agent = "react"
    #: `ours` is Search-R1's format: `<search>`, `<answer>`
    turn_formats = {
        PromptStyle.RELEASED_TRAIN: RELEASED_FORMAT,
        PromptStyle.RELEASED_EVAL: RELEASED_FORMAT,
        PromptStyle.OURS: TurnFormat(stop_tags=("search", "answer"), tool_calls=False),
    }
    default_tags = {
        "think": "think",
        "tool_call": "tool_call",
        "search": "search",
        "answer": "answer",
        "information": "information",
    }
    one_output_per_context = False

    def parse_action(self, text: str) -> Action:
        """MemSearcher's tool-call format (the strict rules) where the style writes it, else Search-R1's tags."""
        if self.turn_format.tool_calls:
            return super().parse_action(text)
        return parse_tag_action(text, self.tags["search"], self.tags["answer"])

    async def rollout(self, trajectory: Trajectory, question: str, run: RunState) -> None:
        user = {"role": "user", "content": self.prompts.render("user", question=question)}
        if self.released:
            messages = [{"role": "system", "content": self.prompts.render("system")}, user]
            prompt_ids = self.encode(self.prompt_text(messages))
        else:
            prompt_ids = await self.ct_build_initial_tokens([user])
        context = Context(prompt_ids=prompt_ids)
        trajectory.contexts.append(context)
        max_turns = self.settings.max_turns
        for turn in range(max_turns):
            step = await self.act(trajectory, context, run, last_turn=turn == max_turns - 1)
            if step.ended:
                return None
            last = turn + 2 == max_turns
            if not await self.add_tool_response(context, step.generation.text, step.calls, step.results, last):
                return trajectory.finish(FinishReason.CONTEXT_LIMIT)
        return trajectory.finish(FinishReason.MAX_TURNS)

    async def add_tool_response(
        self,
        context: Context,
        action_text: str,
        calls: Sequence[ToolCall],
        results: Sequence[str],
        last_turn: bool,
    ) -> bool:
        """Append the tool response (masked); released: as a user turn, then the next `<think>` opening."""
        if not self.released:
            documents = "".join(results)
            observation = self.prompts.render("observation", documents=documents, last_turn=last_turn)
            return self.add_observation(context, observation)
        history = [{"role": "user", "content": ""}, {"role": "assistant", "content": action_text}]
        if not await self.insert_messages(context, history, self.tool_messages(calls, results)):
            return False
        return self.add_inserted_ids(context, self.encode_constant(self.prompts.render("generation_prefix")))
