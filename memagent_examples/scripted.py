"""A scripted policy behind verl's token-in/token-out `generate()`: replays given texts, one per call.

Each text is tokenised once, at construction. A call returns its tokens up to where a server would
stop: the first end-of-sequence id, `max_tokens`, or the first token after which the decoded output
contains a stop string; per-token log-probs are distinct. Tests use it to pin exact multi-turn paths;
the benchmarks use it to replay trajectories of a chosen length. It records every call: prompt ids,
sampling parameters, returned token ids and log-probs.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from verl_memagent.reward.answers import objective_golds


class ScriptedPolicy:
    def __init__(
        self, tokenizer, texts: list[str], server_fields: dict[str, Any] | None = None, hold: Path | None = None
    ):
        """`server_fields`: the `extra_fields` every output carries, as verl's server adds its weight
        version (`global_steps`) to each. `hold`: while this file exists, every call after the first waits,
        so that a trajectory of several calls stays unfinished as long as a test needs (one of one call ends)."""
        self.tokenizer = tokenizer
        self.hold = hold
        self.server_fields = dict(server_fields or {})
        self.texts = list(texts)
        self.token_ids = [tokenizer.encode(text, add_special_tokens=False) for text in self.texts]
        self.calls: list[dict[str, Any]] = []
        self.eos_ids = {tokenizer.eos_token_id}
        self._emitted = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs):
        if len(self.calls) >= len(self.texts):
            raise RuntimeError(f"the script has {len(self.texts)} texts but generate() was called once more")
        index = len(self.calls)
        while index and self.hold is not None and self.hold.exists():
            await asyncio.sleep(0.2)
        call = {"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)}
        self.calls.append(call)
        max_tokens = sampling_params.get("max_tokens", len(self.texts[index]) + 1)
        token_ids = self._emitted_ids(self.token_ids[index], sampling_params.get("stop") or [], max_tokens)
        log_probs = [-0.001 * (self._emitted + i + 1) for i in range(len(token_ids))]
        self._emitted += len(token_ids)
        call.update(token_ids=token_ids, log_probs=log_probs)
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if sampling_params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields=dict(self.server_fields),
        )

    def _emitted_ids(self, ids: list[int], stops: list[str], max_tokens: int) -> list[int]:
        """The tokens a server emits: through the first EOS id, at most `max_tokens` (at least one),
        and no further than the shortest prefix whose decoding contains a stop string.

        A stop string, once in the decoded output, stays in every longer output, so that prefix is
        found by bisection: a few decodes per call instead of one per token.
        """
        end = min(len(ids), max(max_tokens, 1))
        end = next((i + 1 for i, token_id in enumerate(ids[:end]) if token_id in self.eos_ids), end)
        if not self._stopped(ids[:end], stops):
            return list(ids[:end])
        low, high = 1, end  # the first `high` tokens hold a stop string; no prefix shorter than `low` does
        while low < high:
            middle = (low + high) // 2
            if self._stopped(ids[:middle], stops):
                high = middle
            else:
                low = middle + 1
        return list(ids[:low])

    def _stopped(self, ids: list[int], stops: list[str]) -> bool:
        if not stops or not ids:
            return False
        text = self.tokenizer.decode(ids)
        return any(stop in text for stop in stops)


def agent_texts(agent: str, queries: list[str], memories: list[str], answer: str, eos_token: str) -> list[str]:
    """The texts a policy plays in the shipped (released-format) agent loops: one search per query
    (MemSearcher: each followed by its memory rewrite, the matching item of `memories`; MEM1: its
    internal state before it), then the answer."""
    if agent == "mem1":
        states = ["Nothing known yet.", *memories]
        turns = [
            f"<think>{states[i]} Search next.</think>\n<search>{query}</search>" for i, query in enumerate(queries)
        ]
        return [*turns, f"<think>{states[len(queries)]}</think>\n<answer>{answer}</answer>"]
    texts = []
    for query, memory in zip(queries, memories, strict=True):
        call = json.dumps({"name": "wikipedia_search", "arguments": {"query": query}})
        texts.append(f"Look it up.</think>\n<tool_call>{call}</tool_call>{eos_token}")
        if agent == "memsearcher":
            texts.append(f"<memory>{memory}</memory>{eos_token}")
    return [*texts, f"It is known now.</think>\n\\boxed{{{answer}}}{eos_token}"]


def server_weight_versions(row: dict[str, Any]) -> dict[str, int]:
    """The weight version a real rollout server reports (`ScriptedPolicy.server_fields`) for a training row
    dispatched at step s (its `global_steps`): s - 1. verl's sync and colocated trainers update the rollout's
    weights at the end of each step (`on_step_end`; 0, the initial weights, at `on_init_end`), and the
    scripted policy answers at once, so a row dispatched at step s meets the weights of step s - 1, and
    verl's staleness metric (s - 1 - `max_global_steps`) reads 0. A validation pass runs after its step's
    update, where a server reports s itself; verl hands an agent loop the validation flag beside the row,
    not in it, so this is the training rows' version only (no test validates with the scripted loop).
    Nothing where the row has no step."""
    step = row.get("global_steps")
    if step is None:
        return {}
    return dict.fromkeys(("global_steps", "min_global_steps", "max_global_steps"), int(step) - 1)


class ScriptedAgentLoop:
    """The project's agent loop `agent` (its shipped entry, `settings` overriding) with a `ScriptedPolicy`
    in place of the LLM server: rollouts fixed in advance, several turns long, whose rewards differ
    within a group, the same whatever the topology or timing. The trainer's tests at several ranks and
    across a resume train on them. Registered like any loop, in an agent-loop YAML:

        - name: memsearcher
          _target_: memagent_examples.scripted.ScriptedAgentLoop
          agent: memsearcher
          retriever_urls: ${oc.env:MEMAGENT_RETRIEVER_URL}

    Which script a trajectory plays follows from its session (`rollout.n` index) plus its row's dataset
    index: 0 searches twice and answers right, 1 searches once and answers one objective wrong, 2
    answers right without searching; and so on in turn (so with `rollout.n` 1 the rows differ).

    `hold_while` (a path) and `hold_from_step`: in the rows dispatched at step `hold_from_step` or later,
    every call after a trajectory's first waits while that file exists (`ScriptedPolicy`'s `hold`), so that
    a test can keep groups in flight, some of their trajectories finished, where it wants them.
    """

    def __init__(
        self,
        agent: str,
        trainer_config,
        server_manager,
        tokenizer,
        hf_model_type=None,
        hold_while: str | None = None,
        hold_from_step: int = 1,
        **settings,
    ):
        for verl_argument in ("name", "processor", "dataset_cls", "data_config", "tools"):  # the factory's own
            settings.pop(verl_argument, None)
        self.agent, self.trainer_config, self.tokenizer = agent, trainer_config.config, tokenizer
        self.hf_model_type, self.settings = hf_model_type, settings
        self.hold_while, self.hold_from_step = (Path(hold_while) if hold_while else None), hold_from_step

    async def run(self, sampling_params: dict[str, Any], **row):
        from verl_memagent.agent import instantiate_agent_loop

        texts = self.texts(int(row["session_id"]), row)
        held = int(row.get("global_steps", 0)) >= self.hold_from_step
        hold = self.hold_while if held else None
        policy = ScriptedPolicy(self.tokenizer, texts, server_fields=server_weight_versions(row), hold=hold)
        loop = instantiate_agent_loop(
            self.agent, self.trainer_config, policy, self.tokenizer, self.hf_model_type, **self.settings
        )
        return await loop.run(sampling_params, **row)

    @staticmethod
    def searches(session: int, row: dict[str, Any]) -> int:
        """How many searches the trajectory of `session` on `row` makes: 2, 1 or 0 in turn."""
        return 2 - (session + int(row["extra_info"].get("index", 0))) % 3

    def texts(self, session: int, row: dict[str, Any]) -> list[str]:
        golds = [answers[0] for answers in objective_golds(row["reward_model"]["ground_truth"])]
        question = str(row["extra_info"]["question"])
        searches = self.searches(session, row)
        right = len(golds) - 1 if searches == 1 else len(golds)
        answer = "; ".join([golds[i] if i < right else "nothing" for i in range(len(golds))])
        words = question.split()
        queries = [" ".join(words[:6]), " ".join(words[-6:])][:searches]
        memories = [f"Searched: {query}." for query in queries]
        return agent_texts(self.agent, queries, memories, answer, self.tokenizer.eos_token)
