"""Arguments and entry of `verl-memagent eval`; heavy imports wait until the command runs."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from verl_memagent.agent import AGENT_LOOPS_YAML

if TYPE_CHECKING:
    from verl_memagent.eval.judge import JudgeSettings

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
    """The options of `verl-memagent eval`; each destination is a field of `EvalOptions`."""
    parser.add_argument(
        "--agent",
        dest="agents",
        action="append",
        choices=AGENTS,
        required=True,
        help="agent to evaluate; repeat for several",
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
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="[AGENT.]KEY=VALUE", help="agent setting"
    )
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
    judge = parser.add_argument_group("LLM judge (MemSearcher's released llm_judge.py; docs/eval.md)")
    judge.add_argument("--judge-url", metavar="URL", help="OpenAI-compatible server root of the judge; off if unset")
    judge.add_argument("--judge-model", help="the judge's model name (required with --judge-url)")
    judge.add_argument(
        "--judge-api-key-env", default="OPENAI_API_KEY", metavar="VAR", help="environment variable holding its key"
    )
    judge.add_argument("--judge-concurrency", type=int, default=10, help="judge requests in flight (released: 10)")
    judge.add_argument(
        "--judge-cache",
        help="verdicts cache, JSON lines (default: <out>/llm_judge_cache.jsonl); a rerun asks only anew",
    )


@dataclass(frozen=True)
class EvalOptions:
    """One `verl-memagent eval` run as asked for: the parsed command line, read once (`from_args`).

    Field names are the parser's destinations (`add_arguments`), so a new option is one argument plus
    one field; the values the runner needs (settings per agent, sampling params, ...) derive from these.
    """

    agents: tuple[str, ...]
    data: tuple[str, ...]
    out: Path
    model: str | None = None
    server: str | None = None
    served_model: str | None = None
    api_key: str | None = None
    tokenizer: str | None = None
    retriever: str | None = None
    max_turns: int | None = None
    max_new_tokens: int | None = None
    overrides: tuple[str, ...] = ()
    agent_loops: str | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    concurrency: int = 32
    limit: int | None = None
    objectives: int = 1
    num_tasks: int | None = None
    seed: int = 0
    prompt_length: int = 4096
    response_length: int = 8192
    device: str | None = None
    judge_url: str | None = None
    judge_model: str | None = None
    judge_api_key_env: str = "OPENAI_API_KEY"
    judge_concurrency: int = 10
    judge_cache: str | None = None

    def __post_init__(self) -> None:
        if self.tokenizer_path is None:
            raise ValueError("--tokenizer: required with --server (the served checkpoint's tokenizer directory)")
        if self.judge_url and not self.judge_model:
            raise ValueError("--judge-model: required with --judge-url (the judge's model name on that server)")
        if self.judge_concurrency < 1:
            raise ValueError(f"--judge-concurrency: expected a positive integer, got {self.judge_concurrency}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EvalOptions:
        values = {field.name: getattr(args, field.name) for field in fields(cls)}
        values.update(
            agents=tuple(dict.fromkeys(args.agents)),  # --agent x --agent x evaluates x once
            data=tuple(args.data),
            overrides=tuple(args.overrides),
            out=Path(args.out),
        )
        return cls(**values)

    @property
    def tokenizer_path(self) -> str | None:
        """`--tokenizer`, else the model's directory."""
        return self.tokenizer or self.model

    @property
    def agent_loops_path(self) -> Path:
        """`--agent-loops`, else the shipped agent_loops.yaml."""
        return Path(self.agent_loops) if self.agent_loops else AGENT_LOOPS_YAML

    def agent_settings(self) -> dict[str, dict[str, Any]]:
        """Settings per agent: the options every agent shares, then the `--set` overrides."""
        return agent_settings(
            list(self.agents),
            list(self.overrides),
            retriever_urls=self.retriever,
            max_turns=self.max_turns,
            max_new_tokens=self.max_new_tokens,
        )

    def sampling_params(self) -> dict[str, Any]:
        """What verl's validation sends: top_k off, no repetition penalty."""
        from verl_memagent.agent import verl_sampling_params  # imports verl: only when an eval runs

        return verl_sampling_params(self.temperature, self.top_p, logprobs=False)

    def judge(self) -> JudgeSettings | None:
        """The LLM judge asked for, or None."""
        if not self.judge_url:
            return None
        from verl_memagent.eval.judge import JudgeSettings  # imports verl: only when an eval runs

        return JudgeSettings(
            url=self.judge_url,
            model=self.judge_model,
            api_key_env=self.judge_api_key_env,
            concurrency=self.judge_concurrency,
            cache=Path(self.judge_cache) if self.judge_cache else self.out / "llm_judge_cache.jsonl",
        )

    def run_info(self) -> dict[str, Any]:
        """Copied into the summary as `run`."""
        return {
            "model": self.model,
            "server": self.server,
            "served_model": self.served_model,
            "tokenizer": self.tokenizer_path,
            "agent_loops": str(self.agent_loops_path),
            "judge": {"url": self.judge_url, "model": self.judge_model} if self.judge_url else None,
        }


def judge_text(scores: dict[str, Any]) -> str:
    """The judge's accuracy as printed, its failures beside it (they are out of its denominator)."""
    if "llm_judge" not in scores:
        return ""
    accuracy = "n/a" if scores["llm_judge"] is None else f"{scores['llm_judge']:.3f}"
    return f" judge {accuracy} ({scores['llm_judge_judged']} judged, {scores['llm_judge_failed']} failed)"


def _model_type(path: str) -> str | None:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path).model_type
    except (OSError, ValueError):  # a bare tokenizer directory has no model config
        return None


def _in_process_generator(options: EvalOptions):
    import torch

    from verl_memagent.generation.generator import HFGenerator

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    generator = HFGenerator.from_pretrained(
        options.model,
        max_model_len=options.prompt_length + options.response_length,
        default_max_tokens=options.response_length,  # as verl's rollout: a request without max_tokens
        dtype=dtype,
    )
    generator.model.to(device)
    return generator


def run_cli(args: argparse.Namespace) -> int:
    """`verl-memagent eval`: the parsed command line read into `EvalOptions` and run; a bad option exits with its
    message."""
    try:
        options = EvalOptions.from_args(args)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    return run(options)


def run(options: EvalOptions) -> int:
    """Evaluate as `options` ask, print the scores per agent and the summary's path."""
    from transformers import AutoTokenizer

    from verl_memagent.agent import verl_trainer_config
    from verl_memagent.eval.openai_client import CompletionsClient
    from verl_memagent.eval.runner import SUMMARY_FILE, EvalPlan, evaluate
    from verl_memagent.eval.tasks import load_datasets

    tokenizer = AutoTokenizer.from_pretrained(options.tokenizer_path)
    datasets = load_datasets(
        list(options.data), options.limit, objectives=options.objectives, num_tasks=options.num_tasks, seed=options.seed
    )
    plan = EvalPlan(
        list(options.agents),
        options.agent_settings(),
        options.sampling_params(),
        verl_trainer_config(prompt_length=options.prompt_length, response_length=options.response_length),
        options.concurrency,
        _model_type(options.tokenizer_path),
        options.agent_loops_path,
        options.run_info(),
        options.judge(),
    )

    async def main() -> dict[str, Any]:
        if options.model:
            generator = _in_process_generator(options)
        else:
            generator = CompletionsClient(options.server, options.served_model, api_key=options.api_key)
        try:
            return await evaluate(generator, tokenizer, datasets, options.out, plan)
        finally:
            if isinstance(generator, CompletionsClient):
                await generator.aclose()

    summary = asyncio.run(main())
    for agent, result in summary["agents"].items():
        scores = ", ".join(
            f"{name} EM {s['em']:.3f} F1 {s['f1']:.3f} acc {s['acc']:.3f}{judge_text(s)} ({s['num_objectives']:g} "
            f"objectives, mean peak {s['mean_peak_context_tokens']:.0f} tokens)"
            for name, s in result["datasets"].items()
        )
        print(f"{agent}: {scores}; peak context {result['peak_context_tokens']} tokens")
    print(options.out / SUMMARY_FILE)
    return 0
