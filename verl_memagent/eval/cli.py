"""Arguments and entry of `verl-memagent eval`; heavy imports wait until the command runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

AGENTS = ("memsearcher", "mem1", "react")


def agent_settings(agents: list[str], overrides: list[str], **common: Any) -> dict[str, dict[str, Any]]:
    """Settings per agent: `common` (None values skipped), then `KEY=VALUE` or `AGENT.KEY=VALUE` overrides."""
    settings = {agent: {k: v for k, v in common.items() if v is not None} for agent in agents}
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {override!r}: expected KEY=VALUE or AGENT.KEY=VALUE, e.g. topk=5")
        agent, dot, rest = key.partition(".")
        targets, key = ([agent], rest) if dot and agent in AGENTS else (agents, key)
        parsed = yaml.safe_load(value)  # YAML values: 5, true, [a, b], null
        for target in targets:
            if target in settings:
                settings[target][key] = parsed
    return settings


def add_arguments(parser) -> None:
    parser.add_argument(
        "--agent", action="append", choices=AGENTS, required=True, help="agent to evaluate; repeat for several"
    )
    parser.add_argument(
        "--data",
        action="append",
        required=True,
        metavar="NAME=PATH",
        help="FlashRAG JSON lines, or a .parquet written by `verl-memagent prepare` (used as it is); repeat",
    )
    parser.add_argument("--out", required=True, help="output directory (examples.jsonl, summary.json, PNG)")
    backend = parser.add_mutually_exclusive_group(required=True)
    backend.add_argument("--model", help="local HF model directory, generated in-process by transformers")
    backend.add_argument("--server", metavar="URL", help="OpenAI-compatible server root (vLLM, SGLang)")
    parser.add_argument("--served-model", help="model name on --server (default: the first of /v1/models)")
    parser.add_argument("--api-key", help="bearer token for --server")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: --model; required with --server)")
    parser.add_argument("--retriever", metavar="URL", help="retriever URL(s), comma-separated (default: the YAML's)")
    parser.add_argument("--max-turns", type=int, help="turns per trajectory (default: the agent YAML's)")
    parser.add_argument("--max-new-tokens", type=int, help="tokens per generate call (default: the agent YAML's)")
    parser.add_argument("--set", action="append", default=[], metavar="[AGENT.]KEY=VALUE", help="agent setting")
    parser.add_argument("--agent-loops", help="agent-loop YAML (default: the shipped agent_loops.yaml)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=32, help="tasks in flight at once")
    parser.add_argument("--limit", type=int, help="first N tasks of each dataset")
    parser.add_argument(
        "--objectives", type=int, default=1, help="MEM1: questions per task composed from JSON lines (>1 composes)"
    )
    parser.add_argument(
        "--num-tasks", type=int, help="MEM1: tasks to compose, also at --objectives 1 (default: one pass over the pool)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the composer (same as `prepare --seed`)")
    parser.add_argument("--prompt-length", type=int, default=4096, help="verl rollout.prompt_length")
    parser.add_argument("--response-length", type=int, default=8192, help="verl rollout.response_length")
    parser.add_argument("--device", help="in-process device (default: cuda if available, else cpu)")


def _model_type(path: str) -> str | None:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError):  # a bare tokenizer directory has no model config
        return None


def _in_process_generator(args, max_model_len: int, max_new_tokens: int):
    import torch

    from verl_memagent.hf_generator import HFGenerator

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    generator = HFGenerator.from_pretrained(
        args.model, max_model_len=max_model_len, default_max_tokens=max_new_tokens, dtype=dtype
    )
    generator.model.to(device)
    return generator


def run_cli(args) -> int:
    from transformers import AutoTokenizer

    from verl_memagent.agent import AGENT_LOOPS_YAML, verl_trainer_config
    from verl_memagent.eval.openai_client import CompletionsClient
    from verl_memagent.eval.runner import SUMMARY_FILE, evaluate
    from verl_memagent.eval.tasks import load_datasets

    tokenizer_path = args.tokenizer or args.model
    if tokenizer_path is None:
        raise SystemExit("--tokenizer: required with --server (the served checkpoint's tokenizer directory)")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    agents = list(dict.fromkeys(args.agent))
    datasets = load_datasets(
        args.data, args.limit, objectives=args.objectives, num_tasks=args.num_tasks, seed=args.seed
    )
    settings = agent_settings(
        agents, args.set, retriever_urls=args.retriever, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens
    )
    trainer_config = verl_trainer_config(prompt_length=args.prompt_length, response_length=args.response_length)
    sampling_params = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": False,
    }
    run_info = {"model": args.model, "server": args.server, "served_model": args.served_model}
    run_info.update(tokenizer=tokenizer_path, agent_loops=str(args.agent_loops or AGENT_LOOPS_YAML))

    async def main() -> dict[str, Any]:
        if args.model:
            generator = _in_process_generator(
                args, args.prompt_length + args.response_length, args.max_new_tokens or 512
            )
        else:
            generator = CompletionsClient(args.server, args.served_model, api_key=args.api_key)
        try:
            return await evaluate(
                generator,
                tokenizer,
                agents,
                datasets,
                args.out,
                settings=settings,
                sampling_params=sampling_params,
                trainer_config=trainer_config,
                concurrency=args.concurrency,
                hf_model_type=_model_type(tokenizer_path),
                agent_loops=args.agent_loops or AGENT_LOOPS_YAML,
                run_info=run_info,
            )
        finally:
            if isinstance(generator, CompletionsClient):
                await generator.aclose()

    summary = asyncio.run(main())
    for agent, result in summary["agents"].items():
        scores = ", ".join(
            f"{name} EM {s['em']:.3f} F1 {s['f1']:.3f} acc {s['acc']:.3f} ({s['num_objectives']:g} objectives, "
            f"mean peak {s['mean_peak_context_tokens']:.0f} tokens)"
            for name, s in result["datasets"].items()
        )
        print(f"{agent}: {scores}; peak context {result['peak_context_tokens']} tokens")
    print(Path(args.out) / SUMMARY_FILE)
    return 0
