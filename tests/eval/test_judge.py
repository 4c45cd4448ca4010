"""The LLM judge reads replies as MemSearcher's released judge does, and asks a real server.

released_judge.json is what the released `scripts/evaluation/llm_judge.py` (83a3bea) made of held-out
judge replies, run unchanged by fixtures/render_released_judge.py: which replies it kept after its
retries, their verdicts, the prompts it sent and its accuracy. The mechanics (HTTP, JSON, retries,
cache, concurrency) run against vLLM's OpenAI-compatible server of the tiny model, whose verdicts are
noise but whose requests and replies are real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_memagent.eval.judge import (
    TRIES,
    Judge,
    JudgeSettings,
    UnusableReply,
    Verdict,
    VerdictCache,
    judge_prompt,
    judge_summary,
    parse_verdict,
)
from verl_memagent.trajectories.files import read_records

RELEASED = json.loads((Path(__file__).parent / "fixtures" / "released_judge.json").read_text())


@pytest.mark.parametrize("case", RELEASED["cases"], ids=lambda case: repr(case["reply"][:30]))
def test_a_reply_is_kept_and_counted_as_the_released_judge_did(case):
    released = case["released_verdict"]
    if released is None:
        with pytest.raises(UnusableReply):
            parse_verdict(case["reply"])
        return
    verdict = parse_verdict(case["reply"])
    assert verdict.judgement == str(released["judgement"]) and verdict.rationale == str(released["rationale"])
    assert verdict.correct == (released["judgement"] == "correct")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1/"])
async def test_the_judge_url_is_the_server_root_or_an_openai_base_url(url):
    judge = Judge(JudgeSettings(url=url, model="judge"))
    try:
        assert str(judge.http.base_url).rstrip("/") == "http://127.0.0.1:8000"  # asks <root>/v1/chat/completions
    finally:
        await judge.aclose()


def test_the_prompt_and_the_accuracy_are_the_released_ones():
    examples = []
    for case in RELEASED["cases"]:
        assert judge_prompt(case["question"], case["golden_answers"], case["prediction"]) == case["prompt"]
        try:
            verdict = parse_verdict(case["reply"])
            examples.append({"llm_judge": {"correct": verdict.correct}})
        except UnusableReply as error:
            examples.append({"llm_judge": {"failed": str(error)}})
    summary = judge_summary(examples)
    assert summary["llm_judge"] == pytest.approx(RELEASED["released_accuracy"])
    failed = sum(case["released_verdict"] is None for case in RELEASED["cases"])
    assert (summary["llm_judge_judged"], summary["llm_judge_failed"]) == (len(examples) - failed, failed)
    assert judge_summary([]) == {"llm_judge": None, "llm_judge_judged": 0, "llm_judge_failed": 0}


@pytest.mark.slow  # a vLLM engine starts
async def test_a_real_server_is_asked_with_retries_and_the_cache_answers_first(vllm_server, tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "secret")
    examples = [
        {
            "question": f"Which river runs past Leer ({i})?",
            "golden_answers": ["Leda"],
            "prediction": "Leda",
            "scores": {"num_objectives": 1},
        }
        for i in range(3)
    ]
    examples.append(
        {"question": "q1; q2", "golden_answers": [["a"], ["b"]], "prediction": "a", "scores": {"num_objectives": 2}}
    )
    # a verdict an earlier run got for the first question
    cache = VerdictCache(tmp_path / "cache.jsonl")
    prompt = judge_prompt(examples[0]["question"], ["Leda"], "Leda")
    cache.add(VerdictCache.key("tiny-qwen2", prompt), Verdict("correct", "The same river."))
    settings = JudgeSettings(vllm_server.url, "tiny-qwen2", api_key_env="JUDGE_KEY", concurrency=2, cache=cache.path)
    judge = Judge(settings, pause_s=0)
    try:
        await judge.judge_examples(examples)
    finally:
        await judge.aclose()
    assert examples[0]["llm_judge"] == {"judgement": "correct", "rationale": "The same river.", "correct": True}
    assert "llm_judge" not in examples[3]  # a MEM1 task: the released judge reads one question
    # the tiny model's replies are noise: a question's verdict took 1 to TRIES requests, a failure TRIES
    asked = examples[1:3]
    failed = sum("failed" in e["llm_judge"] for e in asked)
    assert TRIES * failed + (len(asked) - failed) <= judge.requests <= TRIES * len(asked)
    summary = judge_summary(examples)
    assert (summary["llm_judge_judged"], summary["llm_judge_failed"]) == (3 - failed, failed)


@pytest.mark.slow  # a vLLM engine starts
def test_eval_with_a_judge_records_each_verdict_and_counts_failures(run_eval_cli, vllm_server, tiny_model_dir, capsys):
    judge = ("--judge-url", vllm_server.url, "--judge-model", "tiny-qwen2")
    out, summary, examples = run_eval_cli("--model", str(tiny_model_dir), *judge, concurrency=4)
    assert summary["run"]["judge"] == {"url": vllm_server.url, "model": "tiny-qwen2"}
    for result in summary["agents"].values():
        for scores in result["datasets"].values():
            assert scores["llm_judge_judged"] + scores["llm_judge_failed"] == scores["n"]
    assert all("llm_judge" in example for example in examples)
    records = read_records(out / "trajectories" / "eval.jsonl")
    assert sorted(json.dumps(r.reward_info["llm_judge"], sort_keys=True) for r in records) == sorted(
        json.dumps(e["llm_judge"], sort_keys=True) for e in examples
    )
    assert " judge " in capsys.readouterr().out  # printed beside EM, with the failures
