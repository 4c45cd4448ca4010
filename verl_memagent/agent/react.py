"""ReAct (Search-R1): the baseline that keeps the whole history in one growing context.

The model reasons, searches with `<search> q </search>`, reads `<information> docs </information>`
appended to its own context (masked), and eventually answers with `<answer> a </answer>`. One
trajectory is one context and one training sample, so its prompt grows with every search: the
baseline the memory agents' flat contexts are measured against.
"""

from __future__ import annotations

from typing import Any

from verl_memagent.agent.parsing import parse_tag_action
from verl_memagent.agent.turns import Context, SearchAgentLoop, Trajectory


class ReactAgentLoop(SearchAgentLoop):
    agent = "react"
    stop_tags = ("search", "answer")
    default_tags = {"think": "think", "search": "search", "answer": "answer", "information": "information"}
    one_output_per_context = False

    async def rollout(self, trajectory: Trajectory, question: str, sampling_params: dict[str, Any]) -> None:
        messages = [{"role": "user", "content": self.prompts.render("user", question=question)}]
        context = Context(prompt_ids=await self.ct_build_initial_tokens(messages))
        trajectory.contexts.append(context)
        max_turns = self.settings.max_turns
        for turn in range(max_turns):
            generation = await self.generate(context, sampling_params)
            if generation is None:
                return trajectory.finish("context_limit")
            action = parse_tag_action(generation.text, self.tags["search"], self.tags["answer"])
            if action.kind == "answer":
                return trajectory.finish("answer", answer=action)
            if action.kind == "invalid":
                return trajectory.finish(action.reason)
            if turn == max_turns - 1:
                return trajectory.finish("max_turns")
            documents = await self.search(context, action.query)
            observation = self.prompts.render("observation", documents=documents, last_turn=turn + 2 == max_turns)
            if not self.add_observation(context, observation):
                return trajectory.finish("context_limit")
