"""The search-tool-call format that `memsearcher` and `react` share: MemSearcher's tool schema, tool
calls, documents and context rendering, and the `action_rules` (agent/parsing.py) that decide which
turns go on and how an answer is judged. One module so that the two agents share it without either
importing the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_memagent.agent.parsing import Action, ActionKind, parse_tool_call_action, released_call, released_tool_calls
from verl_memagent.agent.settings import ActionRules, PromptStyle
from verl_memagent.agent.trajectory import Context, Generation, ToolCall, Trajectory, TurnFormat
from verl_memagent.agent.turns import SearchAgentLoop
from verl_memagent.grammar import released_verdict, tag_spans
from verl_memagent.output_fields import CallFinish, FinishReason, OutputField
from verl_memagent.search import Document


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


#: the released prompt styles' format: MemSearcher's tool calls, and no stop string (a turn ends at the
#: model's end-of-turn token, as in the released code)
RELEASED_FORMAT = TurnFormat(stop_tags=(), tool_calls=True)


class ToolCallAgentLoop(SearchAgentLoop):
    """What `memsearcher` and `react` share: MemSearcher's tool-call format, its context rendering and
    the rules of `action_rules` (released or strict) for which turns go on and how answers are judged."""

    @property
    def released(self) -> bool:
        """Whether the prompt style is a released one (`released_train`, `released_eval`)."""
        return self.settings.prompt_style != PromptStyle.OURS

    @property
    def released_rules(self) -> bool:
        """Whether `action_rules: released` applies: it reads MemSearcher's tool-call format only."""
        return self.settings.action_rules == ActionRules.RELEASED and self.turn_format.tool_calls

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

    def calls_to_run(
        self, trajectory: Trajectory, context: Context, generation: Generation, last_turn: bool
    ) -> list[ToolCall]:
        """The turn's tool calls under `action_rules`; an answer, an invalid action or (strict) a call in
        the last turn ends the trajectory instead."""
        if self.released_rules:
            return self._released_calls(trajectory, generation)
        action = self.parse_action(generation.text)
        if action.kind == ActionKind.ANSWER:
            trajectory.finish(FinishReason.ANSWER, answer=action)
        elif action.kind == ActionKind.INVALID:
            trajectory.finish(action.reason)
        elif last_turn:  # strict: the last turn is for answering
            trajectory.finish(FinishReason.MAX_TURNS)
        else:
            return [ToolCall(text=self._call_text(generation.text), query=action.query)]
        return []

    def _released_calls(self, trajectory: Trajectory, generation: Generation) -> list[ToolCall]:
        """Every call of a turn whose tags pair up (vllm_rollout_spmd.py:612-627); a turn cut by the token
        limit runs none in training (the released inference client does not look). A turn that runs
        none ends the trajectory: `answer` when the released reward accepts its format, else `bad_format`."""
        cut = generation.finish == CallFinish.LENGTH and self.settings.prompt_style != PromptStyle.RELEASED_EVAL
        texts = [] if cut else released_tool_calls(self.action_text(generation.text), self.tags["tool_call"])
        if not texts:
            _, format_ok = self.final_verdict(trajectory.contexts[-1])
            trajectory.finish(FinishReason.ANSWER if format_ok else FinishReason.BAD_FORMAT)
        return [ToolCall(text, *released_call(text)) for text in texts]

    def _call_text(self, text: str) -> str:
        spans = tag_spans(text, self.tags["tool_call"])
        return spans[0] if spans else ""

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
            extra[OutputField.FINAL_RESPONSE] = self.assistant_turns(final)[-1]
        if self.released_rules:
            extra[OutputField.FINAL_ANSWER], extra[OutputField.FINAL_FORMAT_OK] = self.final_verdict(final)
        for output in outputs:
            output.extra_fields.update(extra)
        return outputs

    def tool_messages(self, calls: Sequence[ToolCall], results: Sequence[str]) -> list[dict]:
        """The messages after a turn's calls: one user turn with every tool response (released)."""
        content = "".join(
            self.prompts.render("tool_response", call=call.text, documents=result)
            for call, result in zip(calls, results, strict=True)
        )
        return [{"role": "user", "content": content}]
