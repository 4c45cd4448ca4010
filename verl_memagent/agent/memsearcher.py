"""MemSearcher: each turn sees only the question and a memory the model rewrites after every search.

Turn t's context: system prompt (with the search tool's schema) + user message holding the question
and memory M_{t-1} (empty at first). The model thinks, then answers with `\\boxed{}` or calls the
search tool. After a search the documents come back with an instruction to rewrite the memory (all
masked), and the model writes `<memory> M_t </memory>` in the same context. The next turn starts from
a fresh context with the question and M_t. One context = one training sample: prompt = the rendered
context, response = action + (masked) tool response + memory.

With the released prompt styles the context is the released code's (docs/fidelity.md): the schema
written in the system text, the assistant turn opened with `<think>`, tool response and instruction
in one user turn, no stop strings (a turn ends at the model's end of turn). `released_train` encodes
the question and the memory apart from the template around them, as the released training code's
TokenTemplate did; `released_eval` encodes the whole text, as SGLang did for the released checkpoints.
`action_rules` (agent/parsing.py) decides which turns go on: by default the released rollout's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property
from itertools import chain

from verl_memagent.agent.parsing import parse_memory
from verl_memagent.agent.run_state import RunState
from verl_memagent.agent.settings import PromptStyle
from verl_memagent.agent.tool_calls import RELEASED_FORMAT, ToolCallAgentLoop
from verl_memagent.agent.trajectory import Context, ToolCall, Trajectory, TurnFormat
from verl_memagent.output_fields import CallFinish, FinishReason

#: stand-ins for the question and memory while the template renders, split out again by `released_train`
_QUESTION = "\u2063memagent-question\u2063"
_MEMORY = "\u2063memagent-memory\u2063"


class MemSearcherAgentLoop(ToolCallAgentLoop):
    """`memsearcher`: each turn a fresh context of the question and the memory it rewrites (module docstring)."""

    agent = "memsearcher"
    turn_formats = {
        PromptStyle.RELEASED_TRAIN: RELEASED_FORMAT,
        PromptStyle.RELEASED_EVAL: RELEASED_FORMAT,
        PromptStyle.OURS: TurnFormat(stop_tags=("tool_call", "memory"), tool_calls=True),
    }
    default_tags = {"think": "think", "tool_call": "tool_call", "question": "question", "memory": "memory"}

    @cached_property
    def released_prompt_pieces(self) -> tuple[str, ...]:
        """A released turn's prompt text split around the question's and memory's stand-ins: the same
        text every turn of every trajectory, rendered once per process."""

        def render() -> tuple[str, ...]:
            user = self.prompts.render("user", question=_QUESTION, memory=_MEMORY)
            messages = [{"role": "system", "content": self.prompts.render("system")}, {"role": "user", "content": user}]
            return tuple(re.split(f"({re.escape(_QUESTION)}|{re.escape(_MEMORY)})", self.prompt_text(messages)))

        return self.per_process("released_prompt_pieces", render)

    def released_prompt_ids(self, values: dict[str, str]) -> list[int]:
        """Token ids of a released turn's prompt with the stand-ins replaced by `values`.

        `released_train` encodes the template's text and each value separately, as the released
        TokenTemplate did (the template's pieces once per process), `released_eval` the whole text.
        """
        pieces = self.released_prompt_pieces
        if self.settings.prompt_style == PromptStyle.RELEASED_EVAL:
            return self.encode("".join(values.get(piece, piece) for piece in pieces))
        encoded = (self.encode(values[p]) if p in values else self.encode_constant(p) for p in pieces)
        return list(chain.from_iterable(encoded))

    async def turn_prompt_ids(self, question: str, memory: str, turn: int) -> list[int]:
        """Token ids of turn `turn`'s prompt: the question and the memory written before it."""
        max_turns = self.settings.max_turns
        if self.released:
            return self.released_prompt_ids({_QUESTION: question, _MEMORY: memory})
        user = self.prompts.render(
            "user", question=question, memory=memory, turns_left=max_turns - turn, last_turn=turn == max_turns - 1
        )
        messages = [{"role": "system", "content": self.prompts.render("system")}, {"role": "user", "content": user}]
        return await self.ct_build_initial_tokens(messages, tools=self.tools)

    def assistant_turns(self, context: Context) -> list[str]:
        """The action, opened by the prompt's `<think>`, then the memory rewrite (opened by nothing)."""
        return [self.action_text(text) for text in context.texts[:1]] + context.texts[1:]

    def tool_messages(self, calls: Sequence[ToolCall], results: Sequence[str]) -> list[dict]:
        """`ours`: each result as a tool message, then the rewrite instruction; released: one user turn with both."""
        if self.released:
            return super().tool_messages(calls, results)
        tool_turns = [{"role": "tool", "content": result} for result in results]
        return [*tool_turns, {"role": "user", "content": self.prompts.render("memory_update")}]

    async def rollout(self, trajectory: Trajectory, question: str, run: RunState) -> None:
        max_turns = self.settings.max_turns
        memory, memory_tokens = "", 0
        for turn in range(max_turns):
            prompt_ids = await self.turn_prompt_ids(question, memory, turn)
            context = Context(prompt_ids=prompt_ids, memory_tokens=memory_tokens, memory_before=memory)
            trajectory.contexts.append(context)

            step = await self.act(trajectory, context, run, last_turn=turn == max_turns - 1)
            if step.ended:
                return None
            # the history's text only tells verl's token builder where the new turn starts
            history = [{"role": "user", "content": ""}, {"role": "assistant", "content": step.generation.text}]
            messages = self.tool_messages(step.calls, step.results)
            if not await self.insert_messages(context, history, messages, tools=self.tools):
                return trajectory.finish(FinishReason.CONTEXT_LIMIT)

            memory_gen = await self.generate(context, run)
            if memory_gen is None:
                return trajectory.finish(FinishReason.CONTEXT_LIMIT)
            new_memory, closed = parse_memory(memory_gen.text, self.tags["memory"])
            if self.settings.prompt_style == PromptStyle.RELEASED_EVAL:
                # the released inference client goes on with whatever memory it read, or none (memsearcher.py:289-310)
                memory = new_memory if closed and new_memory else ""
                memory_tokens, context.memory_written = len(self.encode(memory)), bool(memory)
                continue
            if not new_memory:  # the released code goes on only with a non-empty memory
                return trajectory.finish(FinishReason.NO_MEMORY)
            context.memory_written = True
            memory, memory_tokens, truncated = self.truncate(new_memory, self.settings.memory_max_tokens)
            context.memory = memory
            # the released code stops a trajectory whose rewrite ran out of tokens or is too long
            if self.end_on_overflow(trajectory, memory_gen.finish == CallFinish.LENGTH or not closed or truncated):
                return None
            context.memory_truncated = truncated
        return trajectory.finish(FinishReason.MAX_TURNS)
