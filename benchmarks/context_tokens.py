"""Context tokens per turn of memsearcher, mem1 and react over real retrieved documents.

Scripted trajectories of 1..10 turns (T-1 searches, then the answer) run through the real agent
loops, built the way verl builds them, against the real retriever service (BM25 over the bundled
corpus, started here on a free loopback port). The scripts are what a trained model writes in each
agent's format (its defaults, the papers' released formats, unless `--prompt-style` says otherwise)
and give the three agents the same reasoning and the same queries; memsearcher's memory and mem1's
internal state grow by about 40 words of real passage text per search, as a model's notes would.
Every trajectory must end with its answer, well formed, after T turns. For each agent and T it reports the context
length of every turn, the peak context, and the total prefill (prompt tokens of every generate call,
no prefix cache), averaged over the questions; it saves a PNG plot and prints one JSON line last.

Targets: memsearcher and mem1 peaks stay flat within their caps whatever T; react needs >= 3x their
total prefill at T = 10. Also reported: prefill with a prefix cache of the trajectory's earlier
requests (as vLLM's automatic prefix caching serves them), and peak-context ratios.

    python benchmarks/context_tokens.py [--questions 5] [--topk 3] [--prompt-style STYLE] [--tokenizer DIR]
        [--plot PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from shared import (
    AGENTS,
    MEMORY_CONTEXT_CAP,
    REPO,
    build_loop,
    check_trajectory,
    load_questions,
    script,
    start_retriever,
)

from memagent_examples.model_format import ModelFormat
from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import verl_sampling_params, verl_trainer_config, verl_worker_row
from verl_memagent.agent.settings import AgentSettings, PromptStyle

MAX_TURNS = 10


def turn_contexts(agent: str, calls: list[dict], turns: int) -> list[int]:
    """Context length at the end of each turn: prompt + generated tokens of the turn's last call."""
    ends = [2 * t + 1 for t in range(turns - 1)] + [2 * (turns - 1)] if agent == "memsearcher" else list(range(turns))
    return [len(calls[i]["prompt_ids"]) + len(calls[i]["token_ids"]) for i in ends]


def cached_prefill(calls: list[dict]) -> int:
    """Prefill with a prefix cache of the trajectory's earlier requests (vLLM's automatic prefix caching)."""
    seen: list[list[int]] = []
    total = 0
    for call in calls:
        prompt = call["prompt_ids"]
        hit = max((_common_prefix(prompt, earlier) for earlier in seen), default=0)
        total += len(prompt) - hit
        seen.append(prompt + call["token_ids"])
    return total


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


async def run_trajectory(agent, model, question, passages, turns, config, tokenizer, hf_model_type, settings) -> dict:
    policy = ScriptedPolicy(tokenizer, script(model, question, passages, turns))
    loop = build_loop(agent, config, policy, tokenizer, hf_model_type, {**settings, "max_turns": turns})
    outputs = await loop.run(verl_sampling_params(), **verl_worker_row(question["question"]))
    outputs = outputs if isinstance(outputs, list) else [outputs]
    check_trajectory(agent, outputs, policy, turns)
    per_turn = turn_contexts(agent, policy.calls, turns)
    return {
        "per_turn": per_turn,
        "peak": max(per_turn),
        "prefill": sum(len(call["prompt_ids"]) for call in policy.calls),
        "cached_prefill": cached_prefill(policy.calls),
        "samples": len(outputs),
    }


def _model_type(path: str) -> str | None:
    """`model_type` of the config next to the tokenizer (picks verl's Continuous Token builder), if any."""
    config = Path(path) / "config.json"
    return json.loads(config.read_text()).get("model_type") if config.exists() else None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    turns = range(1, MAX_TURNS + 1)
    for agent in AGENTS:
        left.plot(turns, results[agent][MAX_TURNS]["per_turn"], marker="o", label=agent)
        right.plot(turns, [results[agent][t]["prefill"] for t in turns], marker="o", label=agent)
    left.set(xlabel="turn of a 10-turn trajectory", ylabel="context tokens", title="Context length per turn")
    right.set(xlabel="turns in the trajectory", ylabel="tokens", title="Total prefill tokens per trajectory")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def mean_of(runs: list[dict]) -> dict:
    return {
        "per_turn": [round(statistics.mean(values)) for values in zip(*(r["per_turn"] for r in runs), strict=True)],
        "peak": round(statistics.mean(r["peak"] for r in runs)),
        "prefill": round(statistics.mean(r["prefill"] for r in runs)),
        "cached_prefill": round(statistics.mean(r["cached_prefill"] for r in runs)),
        "samples": runs[0]["samples"],
    }


async def measure(questions, passages, tokenizer, hf_model_type, settings: dict) -> dict:
    config = verl_trainer_config(prompt_length=32768, response_length=32768)
    results = {agent: {} for agent in AGENTS}
    for agent in AGENTS:
        model = ModelFormat.of(build_loop(agent, config, None, tokenizer, hf_model_type, settings))
        for turns in range(1, MAX_TURNS + 1):
            runs = [
                await run_trajectory(agent, model, q, passages, turns, config, tokenizer, hf_model_type, settings)
                for q in questions
            ]
            results[agent][turns] = mean_of(runs)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=5, help="multi-hop questions averaged over")
    parser.add_argument(
        "--topk", type=int, default=3, help="documents per search (released: Search-R1 and MEM1 3, MemSearcher 10)"
    )
    parser.add_argument(
        "--prompt-style",
        choices=[style.value for style in PromptStyle],
        default=AgentSettings.prompt_style,
        help="the agents' format",
    )
    parser.add_argument("--tokenizer", help="tokenizer directory with a chat template (default: the tiny BPE)")
    parser.add_argument("--plot", help="PNG path (default: a temporary directory)")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.tokenizer:
            tokenizer_name = args.tokenizer
        else:
            from verl_memagent.tiny_model import build_tokenizer

            tokenizer_name = str(workdir / "tokenizer")
            build_tokenizer().save_pretrained(tokenizer_name)
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name)
        hf_model_type = _model_type(tokenizer_name) if args.tokenizer else "qwen2"
        questions, passages = load_questions(REPO / "data", args.questions)
        server = start_retriever(REPO / "data" / "corpus.jsonl", workdir)
        try:
            settings = {"retriever_urls": server.url, "topk": args.topk, "prompt_style": args.prompt_style}
            results = asyncio.run(measure(questions, passages, tokenizer, hf_model_type, settings))
        finally:
            server.stop()
        plot_path = Path(args.plot) if args.plot else Path(tempfile.mkdtemp()) / "context_tokens.png"
        plot(results, plot_path)

    print(f"{'agent':<12} {'T':>3} {'peak ctx':>9} {'prefill':>9} {'cached':>8} {'samples':>8}   context per turn")
    for agent in AGENTS:
        for turns, r in results[agent].items():
            row = f"{agent:<12} {turns:>3} {r['peak']:>9} {r['prefill']:>9} {r['cached_prefill']:>8} {r['samples']:>8}"
            print(f"{row}   {r['per_turn']}")
    print(f"plot: {plot_path}")

    t10 = {agent: results[agent][MAX_TURNS] for agent in AGENTS}
    peaks = {agent: max(r["peak"] for r in results[agent].values()) for agent in AGENTS}
    headline = {
        "tokenizer": "tiny BPE (verl_memagent.tiny_model)" if not args.tokenizer else args.tokenizer,
        "questions": len(questions),
        "prompt_style": args.prompt_style,
        "prefill_ratio_react_over_memsearcher_t10": round(t10["react"]["prefill"] / t10["memsearcher"]["prefill"], 2),
        "prefill_ratio_react_over_mem1_t10": round(t10["react"]["prefill"] / t10["mem1"]["prefill"], 2),
        "memsearcher_peak_context": peaks["memsearcher"],
        "mem1_peak_context": peaks["mem1"],
        "memsearcher_peak_context_t2": results["memsearcher"][2]["peak"],
        "mem1_peak_context_t2": results["mem1"][2]["peak"],
        "react_peak_context_t10": t10["react"]["peak"],
        "memory_agents_context_cap": MEMORY_CONTEXT_CAP,
        "react_total_prefill_t10": t10["react"]["prefill"],
        "memsearcher_total_prefill_t10": t10["memsearcher"]["prefill"],
        "mem1_total_prefill_t10": t10["mem1"]["prefill"],
    }
    for agent in ("memsearcher", "mem1"):
        headline[f"cached_prefill_ratio_react_over_{agent}_t10"] = round(
            t10["react"]["cached_prefill"] / t10[agent]["cached_prefill"], 2
        )
        headline[f"peak_ratio_react_t10_over_{agent}"] = round(t10["react"]["peak"] / peaks[agent], 2)
    headline["memory_peaks_within_cap"] = max(peaks["memsearcher"], peaks["mem1"]) <= MEMORY_CONTEXT_CAP
    headline["prefill_3x_memsearcher_t10"] = headline["prefill_ratio_react_over_memsearcher_t10"] >= 3.0
    headline["prefill_3x_mem1_t10"] = headline["prefill_ratio_react_over_mem1_t10"] >= 3.0
    print(json.dumps(headline))
    return headline


if __name__ == "__main__":
    main()
