"""The access-code task, its scripted warm start through the real agent loop, and the reward curve."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from transformers import AutoModelForCausalLM

from verl_memagent.agent.parsing import parse_memory, parse_tool_call_action
from verl_memagent.cpu.codes_task import Archive, demonstration, make_archives, write_task
from verl_memagent.cpu.reward_curve import main as reward_curve_main
from verl_memagent.cpu.reward_curve import summary
from verl_memagent.cpu.warm_start import IGNORE, scripted_samples, supervised_steps

REPO = Path(__file__).resolve().parents[2]
AGENT_LOOPS = REPO / "recipes" / "cpu" / "agent_loops.yaml"


def test_archives_are_disjoint_and_seeded():
    task, demos = make_archives(12, seed=3)
    assert (task, demos) == make_archives(12, seed=3)
    names = [a.name for a in task + demos]
    assert len(set(names)) == 24
    assert len({a.code for a in task}) == 12 == len({a.code for a in demos})
    with pytest.raises(ValueError, match="count must be in"):
        make_archives(0)


def test_demonstration_is_a_valid_memsearcher_trajectory():
    archive = make_archives(1)[0][0]
    search, memory, answer = demonstration(archive, "<|im_end|>")
    assert parse_tool_call_action(search, "wikipedia_search").query == f"{archive.name} access code"
    assert parse_memory(memory) == (f"The access code of {archive.name} is {archive.code}.", True)
    assert parse_tool_call_action(answer, "wikipedia_search").answer == archive.code
    assert answer.endswith("<|im_end|>")


@pytest.fixture(scope="module")
def task(tmp_path_factory, retriever_server):
    out = tmp_path_factory.mktemp("codes_task")
    paths = write_task(out / "task", count=6, seed=0)
    command = [sys.executable, "-m", "retriever_server", "build", "--kind", "bm25"]
    subprocess.run([*command, "--corpus", str(paths["corpus"]), "--out", str(out / "bm25")], check=True, cwd=REPO)
    return paths, retriever_server(out / "bm25").url


def test_only_its_own_passage_holds_each_code(task):
    paths, url = task
    questions = [json.loads(line) for line in paths["qa"].read_text().splitlines()]
    body = {"queries": [q["question"] for q in questions], "topk": 1}
    results = httpx.post(f"{url}/retrieve", json=body, timeout=30).json()["result"]
    for question, hits in zip(questions, results, strict=True):
        assert f"is {question['golden_answers'][0]}." in hits[0]["contents"]


def test_warm_start_trains_on_the_loops_own_samples(task, tiny_model_dir, tokenizer):
    paths, url = task
    archives = [Archive(**json.loads(line)) for line in paths["demos"].read_text().splitlines()]
    scripts = [(archive.question, demonstration(archive, tokenizer.eos_token)) for archive in archives]
    samples = asyncio.run(
        scripted_samples("memsearcher", scripts, tokenizer, str(AGENT_LOOPS), 1024, 384, retriever_urls=url)
    )
    assert len(samples) == 2 * len(scripts)  # search + memory context, then the answer context
    for (ids, labels), (_, texts) in zip(samples[1::2], scripts, strict=True):
        trained = [t for t in labels if t != IGNORE]
        assert tokenizer.decode(trained) == texts[2]  # exactly the scripted answer is learned
        assert len(ids) == len(labels)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    losses = supervised_steps(model, samples, steps=12, lr=2e-3, batch_size=4, pad_token_id=tokenizer.pad_token_id)
    assert sum(losses[-3:]) < sum(losses[:3])


def test_reward_curve_summary_png_and_json(tmp_path, capsys):
    rewards, seconds = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7], [20.0, 4.0, 4.0, 5.0, 5.0, 6.0]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"step": i + 1, "data": {"critic/score/mean": r, "timing_s/step": s}}) + "\n"
            for i, (r, s) in enumerate(zip(rewards, seconds, strict=True))
        )
    )
    assert reward_curve_main([str(metrics), "--png", str(tmp_path / "curve.png"), "--window", "2"]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == pytest.approx(
        {"steps": 6, "reward_first": 0.05, "reward_last": 0.6, "reward_gain": 0.55, "seconds_per_step": 4.8}
    )
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="at least 4 logged steps"):
        summary([{"critic/score/mean": 0.0, "timing_s/step": 1.0}], window=2)
