"""Agent-loop CPU cost: what memsearcher, mem1 and react cost a verl agent-loop worker, next to verl's own loop.

A training step runs thousands of trajectories through verl's agent-loop workers, which build one
loop per sample and drive it while the GPUs generate. This measures that CPU: per-sample setup, per
turn and per generate call. The agents run in their default format (the papers' released one)
unless `--prompt-style` says otherwise, on the scripts of `benchmarks/context_tokens.py` (what a
trained model writes in that format). The policy costs nothing: each trajectory is played once with
`ScriptedPolicy` to cut its responses where a server would, and the timed runs replay those token
ids (no encoding or decoding by the policy). Searches go to the real retriever service (BM25 over
the bundled corpus, a separate process whose CPU is not counted).

The anchor, in the same run: verl 0.9.1's `ToolAgentLoop` driving the same conversation for each
agent (the agent's first-turn messages, its queries as hermes tool calls, the same number of
searches and the same documents, uncut) with a minimal search tool on the same retriever client,
declared in a tool YAML (`multi_turn.tool_config_path`) and built once per process with verl's
`load_all_tools`, as verl's AgentLoopWorker builds the tools and hands them to every loop. Every
loop, ours and verl's, is built per sample from its agent-loop YAML entry with hydra, as the worker
builds it.

CPU is process CPU time (`time.process_time`: every thread of this process, so the thread pool that
verl's chat-template helpers run in counts too), not wall time. Setup is the loop's constructor
alone, bound to the arguments hydra passes (hydra's `_partial_`), at steady state; `build` adds
hydra's own per-sample config copy and merge, which verl spends on any loop; the first constructor
call in the process, which fills the per-process caches, is reported apart. A turn is one context of
memsearcher or mem1 (an action, and after a search a memory rewrite for memsearcher), one generate
call of react, one assistant turn of verl's loop. Targets: setup under 1 ms; per-turn CPU at most
verl's on the same conversation.

    python benchmarks/agent_overhead.py [--questions 16] [--turns 5] [--topk 3] [--prompt-style STYLE] [--repeats 3]
        [--observation-max-tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from shared import AGENTS, REPO, check_trajectory, load_questions, queries_of, script, start_retriever
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse
from verl.tools.tool_registry import load_all_tools
from verl.workers.rollout.replica import TokenOutput

from memagent_examples.model_format import ModelFormat
from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import (
    AGENT_LOOPS_YAML,
    instantiate_agent_loop,
    verl_sampling_params,
    verl_trainer_config,
    verl_worker_row,
)
from verl_memagent.agent.settings import AgentSettings, PromptStyle
from verl_memagent.agent.tool_calls import search_tool_schema
from verl_memagent.search import RetrieverClient, format_documents

VERL_LOOP = "tool_agent"
TOOL_NAME = "wikipedia_search"
CONTEXT_CAP = 32768


class RetrieverSearchTool(BaseTool):
    """The minimal verl search tool: one query to the retriever, the documents formatted as ours are."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.client = RetrieverClient(config["retriever_url"])
        self.topk = int(config["topk"])

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs):
        documents = (await self.client.search([parameters["query"]], self.topk))[0]
        return ToolResponse(text=format_documents(documents)), 0.0, {}


class ReplayPolicy:
    """A policy that costs nothing: returns recorded outputs in order (built before timing)."""

    def __init__(self, outputs: list[TokenOutput]):
        self.outputs = outputs
        self.calls = 0

    async def generate(self, request_id: str, **kwargs) -> TokenOutput:
        self.calls += 1
        return self.outputs[self.calls - 1]


def verl_texts(queries: list[str], answer: str, eos: str) -> list[str]:
    """verl's side of the conversation: the same queries as hermes tool calls, each turn ended by EOS."""
    texts = []
    for query in queries:
        call = json.dumps({"name": TOOL_NAME, "arguments": {"query": query}})
        texts.append(
            f"<think>I still miss a fact about {query}; search it.</think>\n<tool_call>{call}</tool_call>{eos}"
        )
    texts.append(f"<think>The evidence answers the question.</think>\n\\boxed{{{answer}}}{eos}")
    return texts


def first_messages(loop, question: str) -> list[dict]:
    """The agent's first-turn chat messages, rendered by its own prompts (verl's loop starts from them)."""
    prompts, max_turns = loop.prompts, loop.settings.max_turns
    user = prompts.render("user", question=question, memory="", turns_left=max_turns, last_turn=False)
    system = [{"role": "system", "content": prompts.render("system")}] if "system" in loop.settings.prompts else []
    return [*system, {"role": "user", "content": user}]


class Bench:
    """One worker process's worth of loops: trainer config, agent-loop YAML (ours and verl's), tools."""

    def __init__(self, tokenizer, url: str, topk: int, turns: int, prompt_style: str, workdir: Path, **settings):
        self.tokenizer, self.turns = tokenizer, turns
        tool_yaml = workdir / "search_tool.yaml"
        tool = {
            "class_name": f"{RetrieverSearchTool.__module__}.{RetrieverSearchTool.__qualname__}",
            "config": {"type": "native", "retriever_url": url, "topk": topk},
            "tool_schema": search_tool_schema(TOOL_NAME),
        }
        tool_yaml.write_text(yaml.safe_dump({"tools": [tool]}))
        # the settings go into the entries, as in a run: the worker passes no per-sample overrides;
        # the rest are each agent's defaults from its agent-loop YAML entry (the papers' released ones)
        settings = {"max_turns": turns, "retriever_urls": url, "topk": topk, "prompt_style": prompt_style, **settings}
        ours = [{**entry, **settings} for entry in yaml.safe_load(AGENT_LOOPS_YAML.read_text())]
        verl_entry = {"name": VERL_LOOP, "_target_": "verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop"}
        self.loops_yaml = workdir / "agent_loops.yaml"
        self.loops_yaml.write_text(yaml.safe_dump([*ours, verl_entry]))
        self.config = verl_trainer_config(
            prompt_length=CONTEXT_CAP,
            response_length=CONTEXT_CAP,
            **{
                "multi_turn.enable": True,
                "multi_turn.tool_config_path": str(tool_yaml),
                "multi_turn.max_assistant_turns": turns,
                "multi_turn.max_tool_response_length": 10**6,  # the same documents as ours, uncut
                "multi_turn.format": "hermes",
            },
        )
        # built once per process and handed to every loop, as verl's AgentLoopWorker does
        multi_turn = self.config.actor_rollout_ref.rollout.multi_turn
        self.tools = load_all_tools(tool_config_path=multi_turn.tool_config_path, function_tool_path=None)

    def build(self, name: str, policy, **hydra_flags):
        """One loop, built per sample the way verl's worker builds it (hydra, the registry entry, the tools)."""
        return instantiate_agent_loop(
            name, self.config, policy, self.tokenizer, "qwen2", path=self.loops_yaml, tools=self.tools, **hydra_flags
        )

    def constructor(self, name: str):
        """The loop's constructor bound to exactly the arguments hydra passes it (hydra's `_partial_`)."""
        bound = self.build(name, ReplayPolicy([]), _partial_=True)
        return functools.partial(bound.func, *bound.args, **bound.keywords)


async def record(bench: Bench, name: str, texts: list[str], row: dict) -> list[TokenOutput]:
    """Play `texts` once through the loop, cut where a server would cut them: the outputs to replay."""
    policy = ScriptedPolicy(bench.tokenizer, texts)
    outputs = await bench.build(name, policy).run(verl_sampling_params(), **row)
    if name in AGENTS:
        check_trajectory(name, outputs if isinstance(outputs, list) else [outputs], policy, bench.turns)
    elif len(policy.calls) != len(texts):
        raise RuntimeError(f"{name}: the loop made {len(policy.calls)} generate calls for {len(texts)} texts")
    return [
        TokenOutput(token_ids=c["token_ids"], log_probs=c["log_probs"], stop_reason="completed") for c in policy.calls
    ]


def constructor_cpu(bench: Bench, name: str, count: int) -> float:
    """Process CPU seconds of one constructor call, over `count` calls."""
    construct = bench.constructor(name)
    start = time.process_time()
    for _ in range(count):
        construct()
    return (time.process_time() - start) / count


async def run_cpu(bench: Bench, name: str, workload: list[tuple[list[TokenOutput], dict]]) -> dict:
    """Process CPU seconds to build (hydra + constructor) and to run the trajectories, one after another."""
    build = run = 0.0
    for outputs, row in workload:
        policy = ReplayPolicy(outputs)
        start = time.process_time()
        loop = bench.build(name, policy)
        built = time.process_time()
        await loop.run(verl_sampling_params(), **row)
        build += built - start
        run += time.process_time() - built
        if policy.calls != len(outputs):
            raise RuntimeError(f"{name}: the replay made {policy.calls} of {len(outputs)} generate calls")
    return {"build": build, "run": run}


async def workloads_of(bench: Bench, questions: list[dict], passages: dict) -> dict[str, list]:
    """For each agent, its trajectories and verl's loop on the same conversations, recorded for replay."""
    turns, eos = bench.turns, bench.tokenizer.eos_token
    workloads: dict[str, list] = {}
    for agent in AGENTS:
        ours, anchor = [], []
        loop = bench.build(agent, ReplayPolicy([]))
        model = ModelFormat.of(loop)
        for question in questions:
            row = verl_worker_row(question["question"])
            ours.append((await record(bench, agent, script(model, question, passages, turns), row), row))
            verl_row = {
                **verl_worker_row(question["question"]),
                "raw_prompt": first_messages(loop, question["question"]),
            }
            texts = verl_texts(queries_of(question, turns), question["golden_answers"][0], eos)
            anchor.append((await record(bench, VERL_LOOP, texts, verl_row), verl_row))
        workloads[agent], workloads[f"{VERL_LOOP}@{agent}"] = ours, anchor
    return workloads


async def measure(bench: Bench, questions: list[dict], passages: dict, repeats: int) -> dict:
    first = {name: constructor_cpu(bench, name, 1) for name in [*AGENTS, VERL_LOOP]}  # fills the process caches
    workloads = await workloads_of(bench, questions, passages)
    samples: dict[str, list] = {name: [] for name in workloads}
    constructors: dict[str, list] = {name: [] for name in [*AGENTS, VERL_LOOP]}
    for _ in range(repeats):
        for name in constructors:
            constructors[name].append(constructor_cpu(bench, name, 200))
        for name, workload in workloads.items():
            samples[name].append(await run_cpu(bench, name.split("@")[0], workload))
    results = {}
    for name, workload in workloads.items():
        loop = name.split("@")[0]
        trajectories = len(workload)
        calls = sum(len(outputs) for outputs, _ in workload)
        run = statistics.median(s["run"] for s in samples[name])
        results[name] = {
            "setup_ms": 1000 * statistics.median(constructors[loop]),
            "first_setup_ms": 1000 * first[loop],
            "build_ms": 1000 * statistics.median(s["build"] for s in samples[name]) / trajectories,
            "turn_ms": 1000 * run / (trajectories * bench.turns),
            "generate_call_ms": 1000 * run / calls,
            "calls_per_trajectory": calls / trajectories,
        }
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=16, help="multi-hop questions, one trajectory each")
    parser.add_argument("--turns", type=int, default=5, help="turns per trajectory: turns-1 searches, then the answer")
    parser.add_argument("--topk", type=int, default=3, help="documents per search")
    parser.add_argument(
        "--prompt-style",
        choices=[style.value for style in PromptStyle],
        default=AgentSettings.prompt_style,
        help="the agents' format",
    )
    parser.add_argument("--repeats", type=int, default=3, help="passes over all trajectories; the median counts")
    parser.add_argument(
        "--observation-max-tokens",
        type=int,
        help="cap every agent's observations at this many tokens (default: each agent's own; none: memsearcher, react)",
    )
    args = parser.parse_args(argv)
    cap = {} if args.observation_max_tokens is None else {"observation_max_tokens": args.observation_max_tokens}

    from transformers import AutoTokenizer

    from verl_memagent.tiny_model import build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        build_tokenizer().save_pretrained(workdir / "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(workdir / "tokenizer")
        questions, passages = load_questions(REPO / "data", args.questions)
        server = start_retriever(REPO / "data" / "corpus.jsonl", workdir)
        try:
            bench = Bench(tokenizer, server.url, args.topk, args.turns, args.prompt_style, workdir, **cap)
            results = asyncio.run(measure(bench, questions, passages, args.repeats))
        finally:
            server.stop()

    print(
        f"process CPU ms; prompt style {args.prompt_style}; {args.questions} trajectories x {args.turns} turns"
        f" ({args.turns - 1} searches); median of {args.repeats} passes;"
        " setup = constructor, build = hydra + constructor"
    )
    print(f"{'loop':<24} {'setup':>7} {'1st':>7} {'build':>7} {'per turn':>9} {'per call':>9} {'calls/traj':>10}")
    for name, r in results.items():
        print(
            f"{name:<24} {r['setup_ms']:>7.3f} {r['first_setup_ms']:>7.1f} {r['build_ms']:>7.3f}"
            f" {r['turn_ms']:>9.3f} {r['generate_call_ms']:>9.3f} {r['calls_per_trajectory']:>10.1f}"
        )
    headline: dict[str, Any] = {"cpu_time": "process", "prompt_style": args.prompt_style}
    headline["observation_max_tokens"] = args.observation_max_tokens
    headline.update(questions=args.questions, turns=args.turns)
    for agent in AGENTS:
        ours, verl = results[agent], results[f"{VERL_LOOP}@{agent}"]
        for key in ("setup_ms", "build_ms", "turn_ms", "generate_call_ms"):
            headline[f"{agent}_{key}"] = round(ours[key], 3)
            headline[f"verl_{key}@{agent}"] = round(verl[key], 3)
        for key in ("setup", "turn", "generate_call"):
            headline[f"{agent}_{key}_ratio"] = round(ours[f"{key}_ms"] / verl[f"{key}_ms"], 2)
    headline["setup_under_1ms"] = all(results[a]["setup_ms"] < 1.0 for a in AGENTS)
    headline["turn_ratio_at_most_1"] = all(headline[f"{a}_turn_ratio"] <= 1.0 for a in AGENTS)
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
