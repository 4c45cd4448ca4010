"""What a model that knows an agent's format writes: its search and answer turns, as text.

Read off a loop built with that format (tags, tool name, the prompt's generation prefix, the chat
template's end of turn), so scripted trajectories in benchmarks and demonstrations in warm starts are
written in whichever format the agent-loop YAML configures, the papers' released ones or ours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from verl_memagent.agent.tool_calls import ToolCallAgentLoop
from verl_memagent.grammar import enclosed


@dataclass(frozen=True)
class ModelFormat:
    """What a trained model writes in one agent's format, read off a loop built with that format.

    Tags, tool name and the generation prefix come from the loop's settings and prompts: a prompt that
    ends with a prefix (released: `<think>`) is continued by the model, so its text starts after it.
    Every turn ends with the chat template's end-of-turn token, as a model ends its turn (with stop
    strings the server cuts there first).
    """

    tags: dict[str, str]
    tool_name: str | None  # the search is a JSON tool call of this tool; None: a `<search>` tag
    prefix: str
    end_of_turn: str

    @classmethod
    def of(cls, loop) -> ModelFormat:
        prompts = loop.settings.prompts
        prefix = loop.prompts.render("generation_prefix") if "generation_prefix" in prompts else ""
        tool_calls = isinstance(loop, ToolCallAgentLoop) and (loop.agent == "memsearcher" or loop.released)
        tool_name = loop.settings.tool_name if tool_calls else None
        end_of_turn = loop.tokenizer.decode(loop.turn_close_ids[-1:] or [loop.tokenizer.eos_token_id])
        return cls(dict(loop.tags), tool_name, prefix, end_of_turn)

    def turn(self, text: str) -> str:
        return text.removeprefix(self.prefix) + self.end_of_turn

    def tagged(self, role: str, content: str) -> str:
        return enclosed(self.tags[role], content)

    def search(self, thought: str, query: str, notes: str) -> list[str]:
        """The texts of a search turn: the action, and for memsearcher the memory rewrite after it."""
        if "state" in self.tags:  # mem1: the notes are its internal state
            return [self.turn(self.tagged("state", f"{notes} {thought}") + self.tagged("search", query))]
        think = self.tagged("think", f" {thought} ")
        if self.tool_name is None:
            return [self.turn(think + self.tagged("search", query))]
        call = json.dumps({"name": self.tool_name, "arguments": {"query": query}})
        texts = [self.turn(think + "\n" + self.tagged("tool_call", "\n" + call + "\n"))]
        if "memory" in self.tags:
            texts.append(self.turn(self.tagged("memory", f" {notes} ")))
        return texts

    def answer(self, thought: str, answer: str, notes: str) -> str:
        if "state" in self.tags:
            return self.turn(self.tagged("state", notes) + self.tagged("answer", answer))
        think = self.tagged("think", f" {thought} ")
        if self.tool_name is None:
            return self.turn(think + self.tagged("answer", answer))
        return self.turn(f"{think} \\boxed{{{answer}}}")
