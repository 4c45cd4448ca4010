"""MEM1: each turn the model consolidates everything it needs into an internal state, then acts.

Turn t's context: the rendered user prompt with the question, then (t > 0) the previous turn's
generated tokens (`<think> state </think>` + `<search> q </search>`) and the observation
`<information> docs </information>` with a turns-left hint. Everything older is dropped. The model
writes a new state and then `<search>` or `<answer>`; multi-objective answers list one answer per
question separated by `;`. One context = one training sample whose response is the turn's generated
tokens only (the observation belongs to the next context's prompt).

The released code writes the state in `<think>` (the paper: `<IS>`; `tags: {state: IS}` renames it)
and checks no format during rollout; `require_state` adds our rule that a turn without a state ends
the trajectory. `released_train` carries the previous turn from its `<think>` onward, as sampled
(Mem1/train/rollout/llm_agent/generation_think.py:241-249); `released_eval` renders each context
as text and encodes it whole, as the released inference client did for the released checkpoint
(Mem1/inference/models.py:63-89, data_pipelines.py:125-177).
"""

from __future__ import annotations

from verl_memagent.agent.parsing import ActionKind, parse_tag_action
from verl_memagent.agent.run_state import RunState
from verl_memagent.agent.settings import PromptStyle
from verl_memagent.agent.trajectory import Context, Generation, ToolCall, Trajectory, TurnFormat
from verl_memagent.agent.turns import SearchAgentLoop
from verl_memagent.data.compose import TASK_PREFIX
from verl_memagent.grammar import closing, enclosed, extract_tag, opened, opening
from verl_memagent.output_fields import FinishReason
from verl_memagent.search import Document


def released_documents(documents: list[Document]) -> str:
    """MEM1's (and Search-R1's) passages: `Doc i(Title: <first line>) <rest>` lines, each ending in a newline.

    The released client keeps the first line of `contents` verbatim as the title, wiki-18's quotes
    included (generation_think.py:692-701, inference/data_pipelines.py:24-31).
    """
    lines = (doc.contents.partition("\n") for doc in documents)
    return "".join(f"Doc {i}(Title: {title}) {text}\n" for i, (title, _, text) in enumerate(lines, start=1))


def released_question(question: str) -> str:
    """The questions as the released prompt lists them: without our task prefix, each ending in '?'."""
    question = question.removeprefix(TASK_PREFIX)
    return question if question.endswith("?") else question + "?"


def released_history_prompt(history: list[int], prompt_tokens: int, kept_tokens: int, cap: int) -> list[int]:
    """MEM1's released training prompt under `released_history_cut`: the rolling history (question
    prompt, then every turn's response and observation) cut to its last `cap` tokens
    (generation_think.py:122-130), of which only the first `prompt_tokens` and the last `kept_tokens`
    stay visible (tensor_helper.py:39-48, generation_think.py:331-344). While the history fits in
    `cap`, that is the question prompt + the last turn; past it, the first tokens are mid-history."""
    window = history[-cap:]
    head = min(prompt_tokens, len(window))
    return window[:head] + window[max(head, len(window) - kept_tokens) :]


class Mem1AgentLoop(SearchAgentLoop):
    """`mem1`: each turn the question, the previous turn (its state and action) and that turn's observation."""

    agent = "mem1"
    #: every style stops at the closing action tags (the released code cut the response there)
    turn_formats = dict.fromkeys(PromptStyle, TurnFormat(stop_tags=("search", "answer"), tool_calls=False))
    default_tags = {"state": "think", "search": "search", "answer": "answer", "information": "information"}

    def format_documents(self, documents: list[Document]) -> str:
        if self.settings.prompt_style == PromptStyle.OURS:
            return super().format_documents(documents)
        return released_documents(documents)

    @property
    def documents_cap(self) -> int | None:
        """`released_train` cuts the whole observation instead (`observation_ids`), as the released code did."""
        return None if self.settings.prompt_style == PromptStyle.RELEASED_TRAIN else super().documents_cap

    def observation_ids(self, observation: str) -> list[int]:
        """The observation's ids; `released_train` cuts them at `observation_max_tokens`, hint and tags
        included, as the released training code cut the tokenised observation (generation_think.py:96-98)."""
        ids = self.encode(observation)
        if self.settings.prompt_style == PromptStyle.RELEASED_TRAIN:
            return ids[: self.settings.observation_max_tokens]
        return ids

    def state_of(self, text: str) -> tuple[str | None, str]:
        """The internal state written before the action, or (None, reason) when there is none."""
        tag = self.tags["state"]
        state = extract_tag(text, tag)
        if state is None:
            return None, FinishReason.UNCLOSED_TAG if opened(text, tag) else FinishReason.NO_STATE
        actions = [self.tags[role] for role in ("search", "answer")]
        action_start = min((text.find(opening(t)) for t in actions if opened(text, t)), default=len(text))
        return (state, "") if text.find(closing(tag)) < action_start else (None, FinishReason.NO_STATE)

    def kept_ids(self, generation: Generation) -> list[int]:
        """The generated ids the next context keeps: from the first `<think>` on (released), or all.

        The sampled ids are cut, never re-encoded, at the token holding the tag's first character; a
        tag that starts inside a token keeps that whole token.
        """
        ids = list(generation.token_ids)
        start = generation.text.find(opening(self.tags["state"]))
        if self.settings.prompt_style == PromptStyle.OURS or start <= 0:
            return ids
        for cut in range(len(ids)):
            if len(self.tokenizer.decode(ids[: cut + 1], skip_special_tokens=True)) > start:
                return ids[cut:]
        return ids

    def eval_text(self, generation: Generation) -> str:
        """The response as the released inference client carried it: stripped, its stop tag re-added."""
        text = generation.text
        for stop in self.stop:
            if text.endswith(stop):
                return text.removesuffix(stop).strip() + stop
        return text.strip()

    def calls_to_run(
        self, trajectory: Trajectory, context: Context, generation: Generation, last_turn: bool
    ) -> list[ToolCall]:
        """The turn's search, once the state written before it is recorded (`record_state`). An invalid
        action, a missing state (`require_state`), a state over the cap (unless `truncate`), an answer
        or a search in the last turn ends the trajectory instead."""
        action = parse_tag_action(generation.text, self.tags["search"], self.tags["answer"])
        if action.kind == ActionKind.INVALID:
            trajectory.finish(action.reason)
            return []
        state, reason = self.state_of(generation.text)
        if state is None and self.settings.require_state:
            trajectory.finish(reason)
            return []
        self.record_state(context, state)
        if self.end_on_overflow(trajectory, context.memory_truncated):
            return []
        if action.kind == ActionKind.ANSWER:
            trajectory.finish(FinishReason.ANSWER, answer=action)
        elif last_turn:
            trajectory.finish(FinishReason.MAX_TURNS)
        else:
            return [ToolCall(text=action.query, query=action.query)]
        return []

    def record_state(self, context: Context, state: str | None) -> None:
        """Record on the context the state its turn wrote (None: none), cut to `memory_max_tokens`:
        what the next context carries (`carried_state`) and the memory fields of its output."""
        context.memory_written = state is not None
        state, _, context.memory_truncated = self.truncate(state or "", self.settings.memory_max_tokens)
        context.memory = state if context.memory_written else None

    def carried_state(self, context: Context) -> tuple[str, int]:
        """The state the next context carries (empty when none was written) and its tokens, as
        `truncate` counted them: the cap when the state was cut."""
        state = context.memory or ""
        tokens = self.settings.memory_max_tokens if context.memory_truncated else len(self.encode(state))
        return state, tokens

    async def rollout(self, trajectory: Trajectory, question: str, run: RunState) -> None:
        if self.settings.prompt_style != PromptStyle.OURS:
            question = released_question(question)
        messages = [{"role": "user", "content": self.prompts.render("user", question=question)}]
        base_ids = await self.ct_build_initial_tokens(messages)
        prompt_ids, carried_state, carried_state_tokens, history = base_ids, "", 0, list(base_ids)
        max_turns, tags = self.settings.max_turns, self.tags
        for turn in range(max_turns):
            context = Context(prompt_ids=prompt_ids, memory_tokens=carried_state_tokens, memory_before=carried_state)
            trajectory.contexts.append(context)
            step = await self.act(trajectory, context, run, last_turn=turn == max_turns - 1)
            if step.ended:
                return None
            generation, (call,), (documents,) = step.generation, step.calls, step.results
            carried_state, carried_state_tokens = self.carried_state(context)
            observation = self.prompts.render(
                "observation", documents=documents, turns_left=max_turns - turn - 1, last_turn=turn + 2 == max_turns
            )
            if self.settings.prompt_style == PromptStyle.RELEASED_EVAL:  # the client sent the conversation as one text
                prompt_ids = self.encode(self.chat_text(messages) + self.eval_text(generation) + observation)
                continue
            # a cut state goes into the next prompt encoded; this context's sample keeps what was sampled
            if context.memory_truncated:
                state = enclosed(tags["state"], carried_state)
                kept = self.encode(f"{state}\n{enclosed(tags['search'], call.query)}")
            else:
                kept = self.kept_ids(generation)
            observation_ids = self.observation_ids(observation)
            if self.settings.released_history_cut:
                history += generation.token_ids + observation_ids
                cap = int(self.rollout_config.prompt_length)
                prompt_ids = released_history_prompt(history, len(base_ids), len(kept) + len(observation_ids), cap)
            else:
                prompt_ids = base_ids + kept + observation_ids
