"""The turn machinery the three agents share, as verl's `AgentLoopBase`: generation, search, limits
and the step every turn takes (`act`).

The trajectory's data (contexts, generations, calls) is plain data in `agent/trajectory.py`, how text
becomes tokens (chat template, inserted messages) is `agent/rendering.py`'s, what one run carries to its
generate calls is `agent/run_state.py`'s, and `agent/outputs.py` makes each finished context one
`AgentLoopOutput` (one training sample).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import httpx
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput

from verl_memagent.agent.outputs import agent_outputs
from verl_memagent.agent.rendering import ChatRendering
from verl_memagent.agent.run_state import RunState
from verl_memagent.agent.settings import AgentSettings, ByValue, MemoryOverflow, parsed_settings
from verl_memagent.agent.trajectory import Context, Generation, Step, ToolCall, Trajectory, TurnFormat, question_of
from verl_memagent.grammar import closing
from verl_memagent.output_fields import CallFinish, FinishReason
from verl_memagent.search import Document, RetrieverClient, RetrieverError, format_documents
from verl_memagent.trajectories.schema import CallSpan, PassageRef, SearchLog

logger = logging.getLogger(__name__)

#: shown to the model when a search fails for good; the metric `retriever_errors` counts these
SEARCH_FAILED = "The search engine is unavailable: no documents were returned."

_CLIENTS: dict[tuple, RetrieverClient] = {}


def shared_retriever(settings: AgentSettings) -> RetrieverClient:
    """One client (one connection pool) per process and retriever setting, shared by all trajectories."""
    key = (
        tuple(settings.retriever_urls),
        settings.retriever_timeout_s,
        settings.retriever_max_retries,
        settings.retriever_backoff_s,
        settings.retriever_token,
    )
    if key not in _CLIENTS:
        _CLIENTS[key] = RetrieverClient(
            settings.retriever_urls,
            timeout_s=settings.retriever_timeout_s,
            max_retries=settings.retriever_max_retries,
            backoff_s=settings.retriever_backoff_s,
            token=settings.retriever_token,
        )
    return _CLIENTS[key]


class SearchAgentLoop(ChatRendering, AgentLoopBase):
    """Base of the memsearcher, mem1 and react loops: verl's constructor plus our settings.

    verl's AgentLoopWorker instantiates a loop per sample with hydra, passing its own arguments and
    every key of the agent's YAML entry: `name` (the registry name) and this agent's settings.
    `tools` (verl's tool list) is not used: these loops search through the retriever client.
    What is the same for every sample (settings, compiled prompts, turn-closing tokens, retriever
    client) is built once per process and shared; an instance only binds its sample's arguments. How
    text becomes tokens (chat template, per-process caches, inserted messages) is `ChatRendering`'s.
    """

    agent: ClassVar[str]
    default_tags: ClassVar[dict[str, str]]
    #: how the agent writes its turns under each prompt style (stop tags, tool-call format)
    turn_formats: ClassVar[Mapping[str, TurnFormat]]
    #: memsearcher and mem1 return one output per context; react's single context is returned bare
    one_output_per_context: ClassVar[bool] = True

    def __init__(
        self,
        trainer_config,
        server_manager,
        tokenizer,
        processor,
        dataset_cls,
        data_config,
        hf_model_type: str | None = None,
        tools=None,
        name: str | None = None,
        **settings,
    ):
        super().__init__(
            trainer_config, server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type=hf_model_type
        )
        self.settings, self.prompts = parsed_settings(self.agent, ByValue(self.default_tags), ByValue(settings))
        self.tags = self.settings.tags
        self.turn_format = self.turn_formats[self.settings.prompt_style]
        rollout = self.rollout_config
        self.response_cap = int(rollout.response_length)
        self.context_cap = self.settings.context_max_tokens or int(rollout.prompt_length) + self.response_cap
        self.retriever = shared_retriever(self.settings)
        self.bind_rendering(tokenizer)

    # ---- verl entry point -------------------------------------------------------------------------

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> list[AgentLoopOutput] | AgentLoopOutput:
        """verl's entry point: play one trajectory for a dataset row (`kwargs`) and return its outputs."""
        trajectory = Trajectory(question=question_of(kwargs))
        run = RunState.of_row(trajectory.id, sampling_params, self.settings.sampling_seed, kwargs)
        await self.rollout(trajectory, trajectory.question, run)
        outputs = self.outputs(trajectory)
        return outputs if self.one_output_per_context else outputs[0]

    async def rollout(self, trajectory: Trajectory, question: str, run: RunState) -> None:
        """Play one trajectory, appending its contexts and calling `trajectory.finish`; every generate
        call goes with `run`."""
        raise NotImplementedError

    # ---- shared steps -----------------------------------------------------------------------------

    @property
    def stop(self) -> list[str]:
        """The stop strings of every generate call: the `stop` setting, else the closing tags of the
        turn format's stop tags."""
        if self.settings.stop is not None:
            return list(self.settings.stop)
        return [closing(self.tags[role]) for role in self.turn_format.stop_tags]

    @property
    def documents_cap(self) -> int | None:
        """Tokens one search's formatted documents are cut to: `observation_max_tokens` (None: no cap)."""
        return self.settings.observation_max_tokens

    def format_documents(self, documents: list[Document]) -> str:
        """The observation text of one search's documents (Search-R1's `Doc i(Title: t) text` lines)."""
        return format_documents(documents)

    def room(self, context: Context) -> int:
        """Tokens the context can still take under the context and response caps."""
        return min(self.context_cap - context.length, self.response_cap - len(context.response_ids))

    def add_observation(self, context: Context, text: str) -> bool:
        """Append an observation (masked) if it leaves room to generate; False (nothing added) otherwise."""
        return self.add_inserted_ids(context, self.encode(text))

    def add_inserted_ids(self, context: Context, ids: list[int] | tuple[int, ...]) -> bool:
        """Append inserted tokens (masked) if they leave room to generate; False (nothing added) otherwise."""
        if len(ids) >= self.room(context):
            return False
        context.add_inserted(list(ids))
        return True

    async def generate(self, context: Context, run: RunState) -> Generation | None:
        """Sample a continuation of the whole context; None when the context or response cap is reached."""
        budget = min(self.settings.max_new_tokens, self.room(context))
        if budget < 1:
            return None
        params = run.next_call(budget, self.stop)
        start = time.perf_counter()
        output = await self.server_manager.generate(
            request_id=run.request_id,
            prompt_ids=context.token_ids,
            sampling_params=params,
            priority=run.priority,
        )
        context.generate_s += time.perf_counter() - start
        context.prefill_tokens += context.length
        context.generate_calls += 1
        _merge_server_fields(context.server_fields, output.extra_fields or {})
        ids = list(output.token_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if ids and ids[-1] in self.eos_ids:
            finish = CallFinish.EOS
        elif any(stop in text for stop in self.stop):
            finish = CallFinish.STOP
        else:
            finish = CallFinish.LENGTH if len(ids) >= budget else CallFinish.EOS
        log_probs = list(output.log_probs) if output.log_probs is not None else None
        generation = Generation(ids, log_probs, text, finish)
        start = context.length
        context.add_generated(generation)
        context.calls.append(CallSpan(start=start, end=context.length, finish=finish))
        return generation

    async def act(self, trajectory: Trajectory, context: Context, run: RunState, last_turn: bool) -> Step:
        """The step every agent's turn takes: generate the action, let `calls_to_run` decide what the turn
        runs (ending the trajectory where it ends here) and run it. A step without calls has ended the
        trajectory (`context_limit` when the context had no room to generate)."""
        generation = await self.generate(context, run)
        if generation is None:
            trajectory.finish(FinishReason.CONTEXT_LIMIT)
            return Step(generation)
        calls = self.calls_to_run(trajectory, context, generation, last_turn)
        results = [await self.search(context, call.query) if call.query is not None else call.error for call in calls]
        return Step(generation, tuple(calls), tuple(results))

    def calls_to_run(
        self, trajectory: Trajectory, context: Context, generation: Generation, last_turn: bool
    ) -> list[ToolCall]:
        """What a turn's generation runs; none (after `trajectory.finish`) when the trajectory ends here."""
        raise NotImplementedError

    async def search(self, context: Context, query: str) -> str:
        """The formatted documents for `query`, cut to the observation cap if any; a failure is an observation."""
        start = time.perf_counter()
        context.searches += 1
        documents: list[Document] = []
        try:
            documents = (await self.retriever.search([query], self.settings.topk))[0]
            text = self.format_documents(documents)
        except (RetrieverError, httpx.HTTPError, OSError, asyncio.TimeoutError) as exc:
            logger.warning("search for %r failed: %s", query, exc)
            context.retriever_errors += 1
            text = SEARCH_FAILED
        finally:
            context.search_s += time.perf_counter() - start
        shown = text if self.documents_cap is None else self.truncate(text, self.documents_cap)[0]
        passages = [PassageRef(id=doc.id, title=doc.title) for doc in documents]
        search = SearchLog(query=query, passages=passages, failed=text == SEARCH_FAILED, text=shown)
        context.search_log.append((len(context.calls), search))
        return shown

    def end_on_overflow(self, trajectory: Trajectory, overflowed: bool) -> bool:
        """Whether a memory (mem1: state) that ran over its cap ended the trajectory here: `memory_overflow`
        `end` and `penalty` end it (`penalty` with every reward 0), `truncate` lets it go on."""
        mode = self.settings.memory_overflow
        if not overflowed or mode == MemoryOverflow.TRUNCATE:
            return False
        trajectory.finish(FinishReason.MEMORY_OVERFLOW, penalised=mode == MemoryOverflow.PENALTY)
        return True

    # ---- outputs ----------------------------------------------------------------------------------

    def outputs(self, trajectory: Trajectory) -> list[AgentLoopOutput]:
        """One AgentLoopOutput per context, in turn order (`agent.outputs`)."""
        end_ids = self.turn_close_ids[-1:] or [self.tokenizer.eos_token_id]
        return agent_outputs(trajectory, self.agent, self.tokenizer, end_ids, self.one_output_per_context)


def _merge_server_fields(fields: dict[str, Any], new: dict[str, Any]) -> None:
    """Keep the weight versions verl tracks for staleness: the first min, the last max."""
    if "min_global_steps" in new and "min_global_steps" not in fields:
        fields["min_global_steps"] = new["min_global_steps"]
    if "max_global_steps" in new:
        fields["max_global_steps"] = new["max_global_steps"]
