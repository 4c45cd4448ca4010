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
"""

from __future__ import annotations

import re
from functools import cached_property
from itertools import chain
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_memagent.agent.parsing import Action, parse_memory, parse_tool_call_action
from verl_memagent.agent.turns import Context, SearchAgentLoop, Trajectory
from verl_memagent.reward.answers import extract_tag
from verl_memagent.search import Document

#: stand-ins for the question and memory while the template renders, split out again by `released_train`
_QUESTION = "\u2063memagent-question\u2063"
_MEMORY = "\u2063memagent-memory\u2063"


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


def released_documents(documents: list[Document]) -> str:
    """MemSearcher's tool result: each passage's `contents` followed by a literal `\\n\\n`, stripped.

    The released client writes the two characters backslash and n, not newlines
    (vllm_rollout_spmd.py:452-455, memsearcher/inference/memsearcher.py:183-186); wiki-18 `contents`
    is the quoted title, a newline, then the text.
    """
    return "".join(f'"{doc.title}"\n{doc.text}\\n\\n' for doc in documents).strip()


class ToolCallAgentLoop(SearchAgentLoop):
    """What `memsearcher` and `react` share: MemSearcher's tool-call format and context rendering."""

    @property
    def released(self) -> bool:
        return self.settings.prompt_style != "ours"

    @property
    def stop_tags(self) -> tuple[str, ...]:
        """The released code sets no stop string: a turn ends at the model's end-of-turn token."""
        return () if self.released else self.ours_stop_tags

    @property
    def tools(self) -> list[dict] | None:
        """The schema the chat template renders (`ours`); the released system text holds it already."""
        return None if self.released else [search_tool_schema(self.settings.tool_name)]

    def action_text(self, text: str) -> str:
        """A turn's text as the reward judges it: a released prompt ends with the turn's opening `<think>`."""
        return self.prompts.render("generation_prefix") + text if self.released else text

    def parse_action(self, text: str) -> Action:
        """The tool-call action of a turn's text, with MemSearcher's format verdict for an answer."""
        return parse_tool_call_action(
            self.action_text(text), self.settings.tool_name, self.tags["tool_call"], self.tags["think"]
        )

    def format_documents(self, documents: list[Document]) -> str:
        return released_documents(documents) if self.released else super().format_documents(documents)

    def prompt_text(self, messages: list[dict]) -> str:
        """The chat template's text of `messages` up to the assistant's turn, and the generation prefix."""
        return self.chat_text(messages, tools=self.tools) + self.prompts.render("generation_prefix")

    def outputs(self, trajectory: Trajectory) -> list[AgentLoopOutput]:
        """The outputs; released, `final_response` is the final assistant turn opened by the prompt's
        `<think>`: the text the released reward judged (re_call.py:97-184)."""
        outputs = super().outputs(trajectory)
        if self.released:
            final = self.prompts.render("generation_prefix") + self.final_turn_text(outputs[-1])
            for output in outputs:
                output.extra_fields["final_response"] = final
        return outputs

    def final_turn_text(self, final_output: AgentLoopOutput) -> str:
        """The text of the final assistant turn: the whole response of the last context."""
        return final_output.extra_fields["final_response"]

    def tool_messages(self, action_text: str, documents: str) -> list[dict]:
        """The messages after a search: one user turn with the tool response (released)."""
        call = extract_tag(action_text, self.tags["tool_call"]) or ""
        return [{"role": "user", "content": self.prompts.render("tool_response", call=call, documents=documents)}]


class MemSearcherAgentLoop(ToolCallAgentLoop):
    agent = "memsearcher"
    ours_stop_tags = ("tool_call", "memory")
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
        if self.settings.prompt_style == "released_eval":
            return self.encode("".join(values.get(piece, piece) for piece in pieces))
        encoded = (self.encode(values[p]) if p in values else self.encode_constant(p) for p in pieces)
        return list(chain.from_iterable(encoded))

    async def turn_prompt_ids(self, question: str, memory: str, turn: int) -> list[int]:
        max_turns = self.settings.max_turns
        if self.released:
            return self.released_prompt_ids({_QUESTION: question, _MEMORY: memory})
        user = self.prompts.render(
            "user", question=question, memory=memory, turns_left=max_turns - turn, last_turn=turn == max_turns - 1
        )
        messages = [{"role": "system", "content": self.prompts.render("system")}, {"role": "user", "content": user}]
        return await self.ct_build_initial_tokens(messages, tools=self.tools)

    def tool_messages(self, action_text: str, documents: str) -> list[dict]:
        if self.released:
            return super().tool_messages(action_text, documents)
        return [
            {"role": "tool", "content": documents},
            {"role": "user", "content": self.prompts.render("memory_update")},
        ]

    async def rollout(self, trajectory: Trajectory, question: str, sampling_params: dict[str, Any]) -> None:
        max_turns, overflow_mode = self.settings.max_turns, self.settings.memory_overflow
        memory, memory_tokens = "", 0
        for turn in range(max_turns):
            prompt_ids = await self.turn_prompt_ids(question, memory, turn)
            context = Context(prompt_ids=prompt_ids, memory_tokens=memory_tokens, memory_before=memory)
            trajectory.contexts.append(context)

            action_gen = await self.generate(context, sampling_params)
            if action_gen is None:
                return trajectory.finish("context_limit")
            action = self.parse_action(action_gen.text)
            if action.kind == "answer":
                return trajectory.finish("answer", answer=action)
            if action.kind == "invalid":
                return trajectory.finish(action.reason)
            if turn == max_turns - 1:
                return trajectory.finish("max_turns")

            documents = await self.search(context, action.query)
            # the history's text only tells verl's token builder where the new turn starts
            history = [{"role": "user", "content": ""}, {"role": "assistant", "content": action_gen.text}]
            new_messages = self.tool_messages(action_gen.text, documents)
            if not await self.insert_messages(context, history, new_messages, tools=self.tools):
                return trajectory.finish("context_limit")

            memory_gen = await self.generate(context, sampling_params)
            if memory_gen is None:
                return trajectory.finish("context_limit")
            new_memory, closed = parse_memory(memory_gen.text, self.tags["memory"])
            if self.settings.prompt_style == "released_eval" and not (closed and new_memory):
                # the released inference client goes on with an empty memory (memsearcher.py:245-310)
                memory, memory_tokens = "", 0
                continue
            if not new_memory:  # the released code goes on only with a non-empty memory
                return trajectory.finish("no_memory")
            context.memory_written = True
            memory, memory_tokens, truncated = self.truncate(new_memory, self.settings.memory_max_tokens)
            context.memory = memory
            if (not closed or truncated) and overflow_mode != "truncate":
                # `end`: the released code stops a trajectory whose rewrite ran out of tokens or is too long
                return trajectory.finish("memory_overflow", penalised=overflow_mode == "penalty")
            context.memory_truncated = truncated
