"""`memagent_examples.learn_codes`: the password task, its warm start (copy pretraining, demonstrations), the curve."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from memagent_examples.build_records import contexts_digest, read_record
from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.copy_rows import CopyRows
from memagent_examples.doors import Door, single_token_words
from memagent_examples.learn_codes.reward_curve import eval_em, follow, summary
from memagent_examples.learn_codes.reward_curve import main as reward_curve_main
from memagent_examples.learn_codes.start import DIGESTED_DOORS, SHIPPED
from memagent_examples.learn_codes.task import (
    build_key,
    demonstration,
    demonstration_samples,
    held_out_doors,
    make_doors,
    warm_start,
    write_task,
)
from memagent_examples.retriever_process import build_command
from memagent_examples.training import IGNORE, supervised_steps
from memagent_examples.warm_start import WarmStartOptions, scripted_samples
from retriever_server.bm25 import terms
from verl_memagent.agent.parsing import parse_memory, parse_tool_call_action
from verl_memagent.cli import main as cli_main
from verl_memagent.search import RetrieverClient

REPO = Path(__file__).resolve().parents[2]
AGENT_LOOPS = REPO / "recipes" / "cpu" / "learn_codes_agent_loops.yaml"


def test_words_are_single_tokens_with_distinct_bm25_terms(tokenizer):
    words = single_token_words(tokenizer)
    assert len(words) > 100
    assert all(len(tokenizer.encode(" " + word)) == 1 for word in words)
    word_terms = terms(words)
    assert all(len(t) == 1 for t in word_terms)
    assert len({t[0] for t in word_terms}) == len(words)
    assert not {"password", "station", "gate"} & set(words)


def test_doors_split_the_grid_and_are_seeded():
    words = [f"w{i}" for i in range(30)]
    task, demos = make_doors(words, stations=4, gates=3, passwords=5, task_count=5, seed=3)
    assert (task, demos) == make_doors(words, stations=4, gates=3, passwords=5, task_count=5, seed=3)
    assert len(task) == 5 and len(demos) == 7
    pairs = {(d.station, d.gate) for d in task + demos}
    assert len(pairs) == 12  # every station x gate door once, in the task or the demonstrations
    stations, gates = {s for s, _ in pairs}, {g for _, g in pairs}
    passwords = {d.password for d in task + demos}
    assert len(stations) == 4 and len(gates) == 3 and len(passwords) <= 5
    assert not (stations & gates) and not (stations | gates) & passwords
    with pytest.raises(ValueError, match="task_count"):
        make_doors(words, stations=2, gates=2, task_count=4)
    with pytest.raises(ValueError, match="too few"):
        make_doors(words[:5])


def test_held_out_doors_use_words_no_task_door_uses(tokenizer):
    words = single_token_words(tokenizer)
    task, demos = make_doors(words, seed=0)
    held_out = held_out_doors(words, task + demos, seed=0)
    assert held_out == held_out_doors(words, task + demos, seed=0) != held_out_doors(words, task + demos, seed=1)
    assert (task, demos) == make_doors(words, seed=0)  # the task and its demonstrations stay what they were
    trained = {w for door in task + demos for w in (door.station, door.gate)}
    held_out_words = {w for door in held_out for w in (door.station, door.gate)}
    assert len(held_out) == 96 and len(held_out_words) == 12 + 8 and not held_out_words & trained
    assert {door.password for door in held_out} <= {door.password for door in task + demos}
    with pytest.raises(ValueError, match="too few"):
        held_out_doors(words, task + demos, stations=len(words), gates=1)


def test_demonstration_is_a_valid_memsearcher_trajectory():
    door = Door("century", "born", "album")
    search, memory, answer = demonstration(door, "<|im_end|>")
    assert parse_tool_call_action(search, "wikipedia_search").query == "password of station century at gate born"
    statement = "The password of station century at gate born is album."
    assert door.passage.endswith(statement)  # memory and answer repeat the passage's sentence: a copy
    assert parse_memory(memory) == (statement, True)
    assert parse_tool_call_action(answer, "wikipedia_search").answer == "album"
    assert answer.endswith("<|im_end|>")


@pytest.fixture(scope="module")
def task(tmp_path_factory, retriever_server, tokenizer):
    """The shipped start's task (its seed), its BM25 index and a retriever serving it."""
    out = tmp_path_factory.mktemp("codes_task")
    seed = read_record(SHIPPED)["inputs"]["seed"]
    paths = write_task(out / "task", tokenizer, seed=seed, base_corpus=REPO / "data" / "corpus.jsonl")
    subprocess.run(build_command("bm25", paths["corpus"], out / "bm25"), check=True, cwd=REPO)
    return paths, retriever_server(out / "bm25").url


def test_searching_a_door_finds_its_own_passage_first(task):
    paths, url = task
    questions = [json.loads(line) for line in paths["qa"].read_text().splitlines()]
    held_out = [json.loads(line) for line in paths["held_out"].read_text().splitlines()]
    demos = [Door(**json.loads(line)) for line in paths["demos"].read_text().splitlines()]
    assert len(questions) == 16 and len(held_out) == 96 and len(demos) == 40 * 40 - 16
    questions += held_out
    searches = [parse_tool_call_action(demonstration(d, "")[0], "wikipedia_search").query for d in demos]
    queries = [q["question"] for q in questions] + searches

    async def search_all() -> list:
        client = RetrieverClient([url])  # sends the 1,600 queries in requests within the server's limit
        try:
            return await client.search(queries, topk=1)
        finally:
            await client.aclose()

    expected = [(q["question"], q["golden_answers"][0]) for q in questions] + [(d.question, d.password) for d in demos]
    for (question, password), hits in zip(expected, asyncio.run(search_all()), strict=True):
        door = question.removeprefix("What is the password of ").removesuffix("?")
        assert f"The password of {door} is {password}." in hits[0].text


def test_warm_start_trains_on_the_loops_own_samples(task, tiny_model_dir, tokenizer):
    paths, url = task
    doors = [Door(**json.loads(line)) for line in paths["demos"].read_text().splitlines()][:6]
    scripts = [(door.question, demonstration(door, tokenizer.eos_token)) for door in doors]
    samples = asyncio.run(
        scripted_samples("memsearcher", scripts, tokenizer, str(AGENT_LOOPS), 1024, 384, "qwen2", retriever_urls=url)
    )
    assert len(samples) == 2 * len(scripts)  # search + memory context, then the answer context
    for ids, _ in samples:  # the chat template's turn boundary, as the live loop builds it with a Qwen model
        assert "<|im_end|><|im_start|>" not in tokenizer.decode(ids)
        assert tokenizer.decode(ids).count("<|im_end|>\n<|im_start|>") >= 2
    for (ids, labels), (_, texts) in zip(samples[1::2], scripts, strict=True):
        trained = [t for t in labels if t != IGNORE]
        assert tokenizer.decode(trained) == texts[2]  # exactly the scripted answer is learned
        assert len(ids) == len(labels)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    losses = supervised_steps(
        model,
        samples,
        steps=12,
        lr=2e-3,
        batch_size=4,
        pad_token_id=tokenizer.pad_token_id,
        extra_rows=(CopyRows(adjacent=2),),
    )
    assert sum(losses[-3:]) < sum(losses[:3])


@pytest.mark.parametrize("start", [SHIPPED, *(SHIPPED_STARTS / agent for agent in ("memsearcher", "mem1", "react"))])
def test_each_shipped_start_has_the_tokenizer_and_config_the_code_builds(tiny_model_dir, tokenizer, start):
    """`START=build` (and `papers_claim.py --start build`) builds what was shipped: the same tokenizer
    (as loaded: transformers converts it to its Qwen2 form), chat template and model config; only the
    weights are trained."""
    shipped = AutoTokenizer.from_pretrained(start)
    assert shipped.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert shipped.chat_template == tokenizer.chat_template
    assert shipped.all_special_tokens == tokenizer.all_special_tokens
    for name in ("config.json", "generation_config.json"):
        built, ours = (json.loads((model / name).read_text()) for model in (tiny_model_dir, start))
        assert {**ours, "transformers_version": None} == {**built, "transformers_version": None}, name


def test_the_agent_loop_builds_the_contexts_the_shipped_start_learned(task):
    """A prompt, template or format change shows the shipped start contexts it was not trained on:
    then this fails, and the start must be rebuilt and shipped anew (docs/learn_codes.md)."""
    paths, url = task
    record = read_record(SHIPPED)
    doors = [Door(**json.loads(line)) for line in paths["demos"].read_text().splitlines()][
        : record["contexts"]["doors"]
    ]
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    model_type = json.loads((SHIPPED / "config.json").read_text())["model_type"]
    samples = demonstration_samples(doors, tokenizer, str(AGENT_LOOPS), url, model_type)
    assert contexts_digest(samples) == record["contexts"]["sha256"]


def test_the_shipped_start_answers_the_task(task, tmp_path):
    """The learning demo's starting point, scored as the demo scores it: greedily it answers 10 of
    the 16 doors (benchmarks/RESULTS.md); a start the agent loop no longer fits answers next to none."""
    paths, url = task
    lengths = yaml.safe_load((REPO / "recipes" / "cpu" / "learn_codes.yaml").read_text())["data"]
    argv = ["eval", "--agent", "memsearcher", "--model", str(SHIPPED), "--agent-loops", str(AGENT_LOOPS)]
    argv += ["--retriever", url, "--prompt-length", str(lengths["max_prompt_length"])]
    argv += ["--response-length", str(lengths["max_response_length"])]
    assert cli_main([*argv, "--data", f"codes={paths['qa']}", "--out", str(tmp_path)]) == 0
    assert eval_em(tmp_path / "summary.json") >= 0.5


def test_a_warm_start_records_how_it_was_built(task, tiny_model_dir, tmp_path):
    paths, url = task
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(paths["demos"].read_text().splitlines(keepends=True)[: DIGESTED_DOORS + 4]))
    out = tmp_path / "warm"
    options = WarmStartOptions(steps=2, batch_size=2, seed=3, copy_steps=1, checkpoint_every=1)
    warm_start(tiny_model_dir, out, demos, url, str(AGENT_LOOPS), options)
    record = read_record(out)
    inputs = {"seed": 3, "copy_steps": 1, "steps": 2, "lr": 1e-3, "decay_steps": 0, "batch_size": 2}
    assert record["inputs"] == inputs and record["samples"] == 2 * (DIGESTED_DOORS + 4)
    assert read_record(out / "step_1")["inputs"]["steps"] == 1
    assert record["versions"]["torch"] == torch.__version__ and record["cpu"]["model"]
    assert record["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert len(record["commit"].removesuffix("+changes")) == 40
    doors = [Door(**json.loads(line)) for line in demos.read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(out)
    played = demonstration_samples(doors[:DIGESTED_DOORS], tokenizer, str(AGENT_LOOPS), url, "qwen2")
    assert record["contexts"] == {"doors": DIGESTED_DOORS, "sha256": contexts_digest(played)}
    other = demonstration_samples(doors[1 : DIGESTED_DOORS + 1], tokenizer, str(AGENT_LOOPS), url, "qwen2")
    assert contexts_digest(other) != contexts_digest(played)
    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0
    with pytest.raises(FileNotFoundError, match="no build record"):
        read_record(tmp_path)


def test_build_key_changes_with_every_input_of_the_build(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "a"}\n')
    key = build_key({"seed": "0", "warm_steps": "400"}, [corpus])
    assert key == build_key({"seed": "0", "warm_steps": "400"}, [corpus])
    assert key != build_key({"seed": "1", "warm_steps": "400"}, [corpus])
    assert key != build_key({"seed": "0", "warm_steps": "400"}, [])
    corpus.write_text('{"id": "0", "contents": "b"}\n')
    assert key != build_key({"seed": "0", "warm_steps": "400"}, [corpus])


def test_reward_curve_summary_png_and_json(tmp_path, capsys):
    rewards, seconds = [0.0, 0.1, 0.2, 0.3, 0.5, 0.7], [20.0, 4.0, 4.0, 5.0, 5.0, 6.0]
    answered, searches = [0.5, 0.5, 0.75, 0.75, 1.0, 1.0], [1.0, 1.5, 1.5, 2.0, 2.0, 1.0]
    lines = [json.dumps({"step": 0, "data": {"val-core/codes/reward/mean@1": 0.1}})]  # validation only
    for i, values in enumerate(zip(rewards, seconds, answered, searches, strict=True)):
        keys = ["critic/score/mean", "timing_s/step", "agent/finish/answered", "agent/searches/mean"]
        data = dict(zip(keys, values, strict=True))
        lines.append(json.dumps({"step": i + 1, "data": data}))
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(lines) + "\n")
    evals = {}
    for name, em in (("before_greedy", 0.25), ("after_greedy", 0.5)):
        (tmp_path / name).mkdir()
        summary_json = {"agents": {"memsearcher": {"overall": {"em": em}}}}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary_json))
        evals[name] = tmp_path / name / "summary.json"
    eval_args = [f"--eval={name}={path}" for name, path in evals.items()]
    assert reward_curve_main(["--print-em", *eval_args]) == 0
    assert capsys.readouterr().out == "EM before | RL questions: greedy 0.250\nEM after | RL questions: greedy 0.500\n"
    args = [str(metrics), "--png", str(tmp_path / "curve.png"), "--window", "2"]
    assert reward_curve_main([*args, *eval_args]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last == pytest.approx(
        {
            "steps": 6,
            "window": 2,
            "reward_first": 0.05,
            "reward_last": 0.6,
            "reward_gain": 0.55,
            "answered_first": 0.5,
            "answered_last": 1.0,
            "searches_first": 1.25,
            "searches_last": 1.5,
            "seconds_per_step": 4.8,
            "em_before_greedy": 0.25,
            "em_after_greedy": 0.5,
        }
    )
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    step = {"critic/score/mean": 0.5, "timing_s/step": 9.0, "agent/finish/answered": 1.0, "agent/searches/mean": 1.0}
    short = summary([{**step, "critic/score/mean": 0.25}, step], window=3)  # a 2-step run: windows of 1
    assert short["window"] == 1 and short["reward_first"] == 0.25 and short["reward_last"] == 0.5
    with pytest.raises(ValueError, match="no training step"):
        summary([], window=2)


def test_follow_prints_one_line_per_training_step(tmp_path):
    lines = [
        {"step": 0, "data": {"val-core/codes/reward/mean@1": 0.1}},
        {
            "step": 1,
            "data": {
                "critic/score/mean": 0.25,
                "timing_s/step": 40.0,
                "agent/finish/answered": 0.875,
                "agent/searches/mean": 1.125,
            },
        },
    ]
    stream = "".join(json.dumps(line) + "\n" for line in lines)
    command = [sys.executable, "-m", "memagent_examples.learn_codes.reward_curve", "--follow"]
    done = subprocess.run(command, input=stream, capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.splitlines() == ["step   1  reward 0.250  answered 0.88  searches 1.12  (40.0 s)"]


def test_follow_says_a_step_is_running_while_none_arrives(capsys):
    read, write = os.pipe()
    with os.fdopen(read) as stream, os.fdopen(write, "w") as writer:
        thread = threading.Thread(target=follow, args=(stream,), kwargs={"quiet_s": 0.2})
        thread.start()
        time.sleep(0.5)  # verl starting: no step yet
        step = {
            "critic/score/mean": 0.5,
            "timing_s/step": 9.0,
            "agent/finish/answered": 1.0,
            "agent/searches/mean": 1.0,
        }
        writer.write(json.dumps({"step": 1, "data": step}) + "\n")
        writer.close()
        thread.join(timeout=10)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("  training: step 1 running (")
    assert lines[-1] == "step   1  reward 0.500  answered 1.00  searches 1.00  (9.0 s)"


def test_unpadded_steps_take_the_padded_batchs_loss(tiny_model_dir):
    """One sample at a time without padding is the same mean over the batch's labelled tokens."""
    generator = torch.Generator().manual_seed(2)
    samples = []
    for length in (12, 40, 25):
        ids = torch.randint(0, 4096, (length,), generator=generator).tolist()
        samples.append((ids, [IGNORE] * (length // 2) + ids[length // 2 :]))
    losses = {}
    for unpadded in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        run = {"steps": 2, "lr": 1e-3, "batch_size": 3, "pad_token_id": 0, "unpadded": unpadded}
        losses[unpadded] = supervised_steps(model, samples, **run)
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
