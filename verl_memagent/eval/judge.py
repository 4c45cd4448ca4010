"""LLM-as-judge accuracy, as MemSearcher's released evaluation computes it (`scripts/evaluation/llm_judge.py`,
icip-cas/MemSearcher 83a3bea), against any OpenAI-compatible chat endpoint.

The released judge asks, per question, with its prompt below (the question, the gold answers as a
Python list, the predicted answer), at temperature 0 with at most 1024 new tokens and a JSON-object
response format. A reply counts when it parses as JSON holding both `judgement` and `rationale`;
anything else is retried, 5 tries in all, one second apart. The question is correct when the
judgement is exactly `"correct"`. A question whose 5 tries all failed is dropped from the
denominator: the released accuracy is correct / judged. Here it is the same figure, and the number
of failures is reported beside it (`llm_judge_failed`), never left out silently.

Concurrency is bounded (the released 10 workers by default), and every verdict is cached on disk
under a key of the judge model and the prompt, so a rerun asks nothing twice; failures are not
cached, a rerun asks again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from verl_memagent.eval.openai_client import server_root

#: the released prompt, word for word (llm_judge.py:12-33)
JUDGE_PROMPT = """You will be given a question and its ground truth answer list where each item can be a ground truth answer. \
Provided a pred_answer, you need to judge if the pred_answer correctly answers the question based on the ground truth answer list. \
You should first give your rationale for the judgement, and then give your judgement result (i.e., correct or incorrect).

Here is the criteria for the judgement:
1. The pred_answer doesn't need to be exactly the same as any of the ground truth answers, but should be semantically same for the question.
2. Each item in the ground truth answer list can be viewed as a ground truth answer for the question, and the pred_answer should be semantically same to at least one of them.

question: {question}
ground truth answers: {gt_answer}
pred_answer: {pred_answer}

The output should in the following json format:
```json 
{{
    "rationale": "your rationale for the judgement, as a text",
    "judgement": "your judgement result, can only be 'correct' or 'incorrect'"
}}
```

Your output:"""  # noqa: E501, W291 (the released text, its long lines and trailing space kept)
TRIES, PAUSE_S, MAX_TOKENS = 5, 1.0, 1024  # llm_judge.py:63, 79
CONCURRENCY = 10  # llm_judge.py: --max_workers


class UnusableReply(ValueError):
    """The judge's reply is not JSON with both `judgement` and `rationale` (the released check)."""


@dataclass(frozen=True)
class Verdict:
    judgement: str  # the judge's word, as it gave it
    rationale: str

    @property
    def correct(self) -> bool:
        return self.judgement == "correct"  # llm_judge.py:46: exactly the string "correct"


def judge_prompt(question: str, golden_answers: list[str], prediction: str | None) -> str:
    """The released prompt for one question: gold answers as `str(list)`, the prediction as the text
    the agent answered (an empty string where it gave none)."""
    return JUDGE_PROMPT.format(
        question=question, gt_answer=str([str(answer) for answer in golden_answers]), pred_answer=prediction or ""
    )


def parse_verdict(content: str | None) -> Verdict:
    """The released rule (llm_judge.py:83-89): `json.loads` of the reply, which must hold both keys."""
    try:
        reply = json.loads(content)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise UnusableReply(f"not JSON: {error}") from None
    if not isinstance(reply, dict) or "judgement" not in reply or "rationale" not in reply:
        raise UnusableReply(f"JSON without both 'judgement' and 'rationale': {str(content)[:200]!r}")
    return Verdict(judgement=str(reply["judgement"]), rationale=str(reply["rationale"]))


@dataclass(frozen=True)
class JudgeSettings:
    url: str  # the server root, e.g. http://127.0.0.1:8000, or with /v1 (requests go to <root>/v1/chat/completions)
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable, never from the command line
    concurrency: int = CONCURRENCY
    cache: Path | None = None  # JSON lines of verdicts; None: no cache


class VerdictCache:
    """Verdicts on disk, one JSON line each, keyed by the judge model and the prompt."""

    def __init__(self, path: Path | None):
        self.path = path
        self.verdicts: dict[str, Verdict] = {}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        if path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                self.verdicts[entry["key"]] = Verdict(entry["judgement"], entry["rationale"])

    @staticmethod
    def key(model: str, prompt: str) -> str:
        return hashlib.sha256(json.dumps([model, prompt]).encode()).hexdigest()

    def add(self, key: str, verdict: Verdict) -> None:
        self.verdicts[key] = verdict
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key, **asdict(verdict)}) + "\n")


class Judge:
    """Asks an OpenAI-compatible chat endpoint for verdicts, with the released retries, bounded
    concurrency and a cache. `requests` counts the HTTP requests made."""

    def __init__(self, settings: JudgeSettings, pause_s: float = PAUSE_S):
        self.settings, self.pause_s = settings, pause_s
        key = os.environ.get(settings.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.AsyncClient(base_url=server_root(settings.url), headers=headers, timeout=300)
        self.cache = VerdictCache(settings.cache)
        self.slots = asyncio.Semaphore(settings.concurrency)
        self.requests = 0

    async def verdict(self, prompt: str) -> Verdict:
        """The judge's verdict on `prompt`; raises `UnusableReply` or `httpx.HTTPError` after the last try."""
        key = VerdictCache.key(self.settings.model, prompt)
        if key in self.cache.verdicts:
            return self.cache.verdicts[key]
        async with self.slots:
            for attempt in range(TRIES):
                try:
                    verdict = parse_verdict(await self._ask(prompt))
                    break
                except (UnusableReply, httpx.HTTPError):
                    if attempt == TRIES - 1:
                        raise
                    await asyncio.sleep(self.pause_s)
        self.cache.add(key, verdict)
        return verdict

    async def _ask(self, prompt: str) -> str | None:
        self.requests += 1
        response = await self.http.post(
            "/v1/chat/completions",
            json={
                "model": self.settings.model,
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
                "response_format": {"type": "json_object"},
            },
        )
        response.raise_for_status()
        return response.json()["choices"][0]["message"]["content"]

    async def judge_examples(self, examples: list[dict[str, Any]], done: Callable[[], Any] = lambda: None) -> None:
        """Add `llm_judge` to each one-question example: {judgement, rationale, correct} or {failed};
        `done()` after each. Multi-objective tasks (MEM1) are not judged: the released judge reads one
        question."""

        async def one(example: dict[str, Any]) -> None:
            prompt = judge_prompt(example["question"], example["golden_answers"], example["prediction"])
            try:
                verdict = await self.verdict(prompt)
            except (UnusableReply, httpx.HTTPError) as error:
                example["llm_judge"] = {"failed": f"{type(error).__name__}: {error}"[:500]}
            else:
                example["llm_judge"] = {**asdict(verdict), "correct": verdict.correct}
            done()

        await asyncio.gather(*(one(e) for e in examples if e["scores"]["num_objectives"] == 1))

    async def aclose(self) -> None:
        await self.http.aclose()


def judge_summary(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """`llm_judge` (correct / judged, the released figure; None when nothing was judged),
    `llm_judge_judged`, `llm_judge_failed` of some examples."""
    verdicts = [e["llm_judge"] for e in examples if "llm_judge" in e]
    judged = [v for v in verdicts if "failed" not in v]
    return {
        "llm_judge": sum(v["correct"] for v in judged) / len(judged) if judged else None,
        "llm_judge_judged": len(judged),
        "llm_judge_failed": len(verdicts) - len(judged),
    }
