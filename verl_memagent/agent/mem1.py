"""MEM1: each turn the model consolidates everything it needs into an internal state, then acts.

Turn t's context: the rendered user prompt with the question, then (t > 0) the previous turn's
generated tokens exactly as sampled (`<IS> state </IS>` + `<search> q </search>`) and the
observation `<information> docs </information>` with a "k turns left" hint. Everything older is
dropped. The model writes a new `<IS>` and then `<search>` or `<answer>`; multi-objective answers
list one answer per question separated by `;`. One context = one training sample whose response is
the turn's generated tokens only (the observation belongs to the next context's prompt).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import register

from verl_memagent.agent.parsing import parse_tag_action
from verl_memagent.agent.turns import Context, SearchAgentLoop, Trajectory
from verl_memagent.reward.answers import extract_tag


@register("mem1")
class Mem1AgentLoop(SearchAgentLoop):
    agent = "mem1"
    stop_tags = ("search", "answer")
    default_tags = {"state": "IS", "search": "search", "answer": "answer", "information": "information"}

    def state_of(self, text: str) -> tuple[str | None, str]:
        """The internal state written before the action, or (None, reason) when there is none."""
        tag = self.tags["state"]
        state = extract_tag(text, tag)
        if state is None:
            return None, "unclosed_tag" if f"<{tag}>" in text else "no_state"
        action_start = min(
            (text.find(f"<{self.tags[t]}>") for t in ("search", "answer") if f"<{self.tags[t]}>" in text),
            default=len(text),
        )
        return (state, "") if text.find(f"</{tag}>") < action_start else (None, "no_state")

    async def rollout(self, trajectory: Trajectory, question: str, sampling_params: dict[str, Any]) -> None:
        messages = [{"role": "user", "content": self.prompts.render("user", question=question)}]
        base_ids = await self.ct_build_initial_tokens(messages)
        carried: list[int] = []
        carried_state_tokens = 0
        max_turns, tags = self.settings.max_turns, self.tags
        for turn in range(max_turns):
            context = Context(prompt_ids=base_ids + carried, memory_tokens=carried_state_tokens)
            trajectory.contexts.append(context)
            generation = await self.generate(context, sampling_params)
            if generation is None:
                return trajectory.finish("context_limit")
            action = parse_tag_action(generation.text, tags["search"], tags["answer"])
            if action.kind == "invalid":
                return trajectory.finish(action.reason)
            state, reason = self.state_of(generation.text)
            if state is None:
                return trajectory.finish(reason)
            context.memory_written = True
            state, carried_state_tokens, truncated = self.truncate(state, self.settings.memory_max_tokens)
            context.memory_truncated = truncated
            if truncated and self.settings.memory_overflow == "penalty":
                return trajectory.finish("memory_overflow", penalised=True)
            if action.kind == "answer":
                return trajectory.finish("answer")
            if turn == max_turns - 1:
                return trajectory.finish("max_turns")

            documents = await self.search(context, action.query)
            if truncated:  # the next prompt holds the cut state, encoded; the sample keeps what was sampled
                kept = self.encode(
                    f"<{tags['state']}>{state}</{tags['state']}>\n<{tags['search']}>{action.query}</{tags['search']}>"
                )
            else:
                kept = generation.token_ids
            observation = self.prompts.render(
                "observation", documents=documents, turns_left=max_turns - turn - 1, last_turn=turn + 2 == max_turns
            )
            carried = kept + self.encode(observation)
