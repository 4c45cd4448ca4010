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
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_memagent.agent.parsing import (
    Action,
    parse_memory,
    parse_tool_call_action,
    released_call,
    released_tool_calls,
)
from verl_memagent.agent.turns import Context, Generation, SearchAgentLoop, Trajectory
from verl_memagent.reward.answers import tag_spans
from verl_memagent.reward.formats import released_verdict
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
    """MemSearcher's tool result: each passage's `contents`, verbatim, followed by a literal `\\n\\n`, stripped.

    The released client writes the two characters backslash and n, not newlines
    (vllm_rollout_spmd.py:452-455, memsearcher/inference/memsearcher.py:183-186).
    """
    return "".join(f"{doc.contents}\\n\\n" for doc in documents).strip()


@dataclass(frozen=True)
class ToolCall:
    """One tool call a turn runs: its text between the tags (the released tool response repeats it)
    and the query it searches, or, when it cannot search, the text the model gets instead."""

    text: str
    query: str | None
    error: str = ""


class ToolCallAgentLoop(SearchAgentLoop):
    """What `memsearcher` and `react` share: MemSearcher's tool-call format, its context rendering and
    the rules of `action_rules` (released or strict) for which turns go on and how answers are judged."""

    #: whether this loop writes MemSearcher's tool-call format (react's `ours` style is Search-R1's tags)
    tool_call_format = True

    @property
    def released(self) -> bool:
        return self.settings.prompt_style != "ours"

    @property
    def released_rules(self) -> bool:
        return self.settings.action_rules == "released" and self.tool_call_format

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
        """The strict rules' action of a turn's text, with the strict format verdict for an answer."""
        return parse_tool_call_action(
            self.action_text(text), self.settings.tool_name, self.tags["tool_call"], self.tags["think"]
        )

    def format_documents(self, documents: list[Document]) -> str:
        return released_documents(documents) if self.released else super().format_documents(documents)

    def prompt_text(self, messages: list[dict]) -> str:
        """The chat template's text of `messages` up to the assistant's turn, and the generation prefix."""
        return self.chat_text(messages, tools=self.tools) + self.prompts.render("generation_prefix")

    # ---- which turns go on ----------------------------------------------------------------------

    def calls_to_run(self, trajectory: Trajectory, generation: Generation, last_turn: bool) -> list[ToolCall]:
        """The calls a turn runs; none after finishing the trajectory at this turn."""
        if self.released_rules:
            return self._released_calls(trajectory, generation)
        action = self.parse_action(generation.text)
        if action.kind == "answer":
            trajectory.finish("answer", answer=action)
        elif action.kind == "invalid":
            trajectory.finish(action.reason)
        elif last_turn:  # strict: the last turn is for answering
            trajectory.finish("max_turns")
        else:
            return [ToolCall(text=self._call_text(generation.text), query=action.query)]
        return []

    def _released_calls(self, trajectory: Trajectory, generation: Generation) -> list[ToolCall]:
        """Every call of a turn whose tags pair up (vllm_rollout_spmd.py:612-627); a turn cut by the token
        limit runs none in training (the released inference client does not look). A turn that runs
        none ends the trajectory: `answer` when the released reward accepts its format, else `bad_format`."""
        cut = generation.finish == "length" and self.settings.prompt_style != "released_eval"
        texts = [] if cut else released_tool_calls(self.action_text(generation.text), self.tags["tool_call"])
        if not texts:
            _, format_ok = self.final_verdict(trajectory.contexts[-1])
            trajectory.finish("answer" if format_ok else "bad_format")
        return [ToolCall(text, *released_call(text)) for text in texts]

    def _call_text(self, text: str) -> str:
        spans = tag_spans(text, self.tags["tool_call"])
        return spans[0] if spans else ""

    async def call_results(self, context: Context, calls: list[ToolCall]) -> list[str]:
        """Each call's result: its documents, or the text the released client shows for a call it cannot run."""
        return [await self.search(context, call.query) if call.query is not None else call.error for call in calls]

    # ---- the reward's verdict -------------------------------------------------------------------

    def assistant_turns(self, context: Context) -> list[str]:
        """The context's assistant turns as the released reward reads them, each with the opening the
        prompt gave it (memsearcher: the action's `<think>`; react: every turn's)."""
        return [self.action_text(text) for text in context.texts]

    def final_verdict(self, context: Context) -> tuple[str | None, bool]:
        """(answer, format ok) of the released reward on the final context (re_call.py:97-184); the
        context must end at the end-of-sequence token the model sampled."""
        ended = bool(context.response_mask) and context.response_mask[-1] == 1
        ended = ended and context.response_ids[-1] == self.tokenizer.eos_token_id
        return released_verdict(self.assistant_turns(context), ended, self.tags["think"], self.tags["tool_call"])

    def outputs(self, trajectory: Trajectory) -> list[AgentLoopOutput]:
        """The outputs; released, `final_response` is the final assistant turn opened by the prompt's
        `<think>`, and under the released rules the record is the released reward's verdict on the
        final context, however the trajectory ended (a memory rewrite can hold the answer)."""
        outputs = super().outputs(trajectory)
        final, extra = trajectory.contexts[-1], {}
        if self.released and final.texts:
            extra["final_response"] = self.assistant_turns(final)[-1]
        if self.released_rules:
            extra["final_answer"], extra["final_format_ok"] = self.final_verdict(final)
        for output in outputs:
            output.extra_fields.update(extra)
        return outputs

    def tool_messages(self, calls: list[ToolCall], results: list[str]) -> list[dict]:
        """The messages after a turn's calls: one user turn with every tool response (released)."""
        content = "".join(
            self.prompts.render("tool_response", call=call.text, documents=result)
            for call, result in zip(calls, results, strict=True)
        )
        return [{"role": "user", "content": content}]


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

    def assistant_turns(self, context: Context) -> list[str]:
        """The action, opened by the prompt's `<think>`, then the memory rewrite (opened by nothing)."""
        return [self.action_text(text) for text in context.texts[:1]] + context.texts[1:]

    def tool_messages(self, calls: list[ToolCall], results: list[str]) -> list[dict]:
        if self.released:
            return super().tool_messages(calls, results)
        tool_turns = [{"role": "tool", "content": result} for result in results]
        return [*tool_turns, {"role": "user", "content": self.prompts.render("memory_update")}]

    async def rollout(self, trajectory: Trajectory, question: str, sampling_params: dict[str, Any]) -> None:
        max_turns = self.settings.max_turns
        memory, memory_tokens = "", 0
        for turn in range(max_turns):
            prompt_ids = await self.turn_prompt_ids(question, memory, turn)
            context = Context(prompt_ids=prompt_ids, memory_tokens=memory_tokens, memory_before=memory)
            trajectory.contexts.append(context)

            action_gen = await self.generate(context, sampling_params)
            if action_gen is None:
                return trajectory.finish("context_limit")
            calls = self.calls_to_run(trajectory, action_gen, last_turn=turn == max_turns - 1)
            if not calls:
                return None
            results = await self.call_results(context, calls)
            # the history's text only tells verl's token builder where the new turn starts
            history = [{"role": "user", "content": ""}, {"role": "assistant", "content": action_gen.text}]
            if not await self.insert_messages(context, history, self.tool_messages(calls, results), tools=self.tools):
                return trajectory.finish("context_limit")

            memory_gen = await self.generate(context, sampling_params)
            if memory_gen is None:
                return trajectory.finish("context_limit")
            new_memory, closed = parse_memory(memory_gen.text, self.tags["memory"])
            if self.settings.prompt_style == "released_eval":
                # the released inference client goes on with whatever memory it read, or none (memsearcher.py:289-310)
                memory = new_memory if closed and new_memory else ""
                memory_tokens, context.memory_written = len(self.encode(memory)), bool(memory)
                continue
            if not new_memory:  # the released code goes on only with a non-empty memory
                return trajectory.finish("no_memory")
            context.memory_written = True
            memory, memory_tokens, truncated = self.truncate(new_memory, self.settings.memory_max_tokens)
            context.memory = memory
            overflow_mode = self.settings.memory_overflow
            if (memory_gen.finish == "length" or not closed or truncated) and overflow_mode != "truncate":
                # `end`: the released code stops a trajectory whose rewrite ran out of tokens or is too long
                return trajectory.finish("memory_overflow", penalised=overflow_mode == "penalty")
            context.memory_truncated = truncated
        return trajectory.finish("max_turns")
