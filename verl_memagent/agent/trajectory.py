"""What a trajectory is made of, as plain data: its contexts, each generate call, the calls a turn
runs, the step a turn takes, and how each agent's turns are written.

A `Context` is one LLM context as it grows during a turn: prompt tokens, then response tokens with
their mask (1 = sampled by the policy, 0 = inserted by us) and rollout log-probs. Sampled token ids
go in exactly as the server returned them; only observations and chat-template tokens are encoded.
Each finished context becomes one `AgentLoopOutput` (one training sample, `turns.SearchAgentLoop.outputs`).
Nothing here talks to verl, the server or the retriever.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from verl_memagent.agent.parsing import Action
from verl_memagent.trajectories.schema import CallSpan, SearchLog


@dataclass(frozen=True)
class TurnFormat:
    """How an agent writes its turns under one prompt style."""

    #: tag roles whose closing tag ends a generate call (unless the `stop` setting is given); none: the
    #: model's end of turn ends it, as in the released MemSearcher code
    stop_tags: tuple[str, ...]
    #: MemSearcher's format (`<tool_call>` JSON searches, `\boxed{}` answers), read by `action_rules`;
    #: False: Search-R1's and MEM1's tags (`<search>`, `<answer>`)
    tool_calls: bool


@dataclass
class Generation:
    """One generate call: the sampled ids and log-probs, their text (for parsing only), why it ended."""

    token_ids: list[int]
    log_probs: list[float] | None
    text: str
    finish: str  # a `CallFinish`


@dataclass
class Context:
    """One LLM context: prompt ids, then response ids with mask and log-probs, plus its counters."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)
    #: the text of each generate call in this context, in order (what the rewards judge)
    texts: list[str] = field(default_factory=list)
    prefill_tokens: int = 0
    generate_calls: int = 0
    searches: int = 0
    retriever_errors: int = 0
    memory_tokens: int = 0
    memory_truncated: bool = False
    memory_written: bool = False
    generate_s: float = 0.0
    search_s: float = 0.0
    server_fields: dict[str, Any] = field(default_factory=dict)
    # what the turns did, for trajectory records (`turn_log` in the outputs)
    calls: list[CallSpan] = field(default_factory=list)
    search_log: list[tuple[int, SearchLog]] = field(default_factory=list)  # (calls made before it, search)
    memory_before: str | None = None  # the memory (MEM1: state) this context holds; None: the agent has none
    memory: str | None = None  # the memory (state) written in this context, after its cap

    @property
    def token_ids(self) -> list[int]:
        """The whole context as the server reads it: prompt, then response."""
        return self.prompt_ids + self.response_ids

    @property
    def length(self) -> int:
        """len(token_ids), without building the list."""
        return len(self.prompt_ids) + len(self.response_ids)

    def add_generated(self, generation: Generation) -> None:
        """Append a generate call's sampled ids (mask 1) and log-probs; a call without log-probs drops the context's."""
        self.texts.append(generation.text)
        self.response_ids += generation.token_ids
        self.response_mask += [1] * len(generation.token_ids)
        if self.response_logprobs is not None and generation.log_probs is not None:
            self.response_logprobs += generation.log_probs
        else:
            self.response_logprobs = None

    def add_inserted(self, token_ids: list[int]) -> None:
        """Append ids we inserted, not sampled (mask 0, log-prob 0)."""
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        if self.response_logprobs is not None:
            self.response_logprobs += [0.0] * len(token_ids)


@dataclass(frozen=True)
class ToolCall:
    """One call a turn runs: its text between the tags (the released tool response repeats it) and
    the query it searches, or, when it cannot search, the text the model gets instead."""

    text: str
    query: str | None
    error: str = ""


@dataclass
class Trajectory:
    """The contexts of one run() call and how the run ended."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    question: str = ""
    contexts: list[Context] = field(default_factory=list)
    finish_reason: str = ""
    penalised: bool = False
    answer: Action | None = None  # the final answer action, parsed with the agent's tags

    def finish(self, reason: str, penalised: bool = False, answer: Action | None = None) -> None:
        """Record how the trajectory ended (a `FinishReason`), whether every reward gives it 0, and its answer."""
        self.finish_reason, self.penalised, self.answer = reason, penalised, answer


@dataclass(frozen=True)
class Step:
    """What a turn's action did (`SearchAgentLoop.act`): its generation, the calls it runs and each
    call's result (documents, or the text a call that cannot search shows). No calls: the trajectory
    ended at this turn (`generation` is None when the context had no room to generate)."""

    generation: Generation | None
    calls: tuple[ToolCall, ...] = ()
    results: tuple[str, ...] = ()

    @property
    def ended(self) -> bool:
        """Whether the trajectory ended at this step: it runs no call."""
        return not self.calls


def question_of(kwargs: dict[str, Any]) -> str:
    """The question of a dataset row: `extra_info.question`, else the last user message of the prompt."""
    extra_info = kwargs.get("extra_info") or {}
    if extra_info.get("question"):
        return str(extra_info["question"])
    messages = kwargs.get("raw_prompt")
    if messages is None:
        raise ValueError(
            "the dataset row has neither extra_info.question nor a raw_prompt: run `verl-memagent prepare`"
        )
    user_messages = [m["content"] for m in messages if m["role"] == "user"]
    if not user_messages:
        raise ValueError("raw_prompt has no user message to take the question from")
    return str(user_messages[-1])
