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
from retriever_process import build_command
from transformers import AutoModelForCausalLM, AutoTokenizer

from memagent_examples.composed_doors import SHIPPED_STARTS
from memagent_examples.learn_codes.reward_curve import eval_em, follow, summary
from memagent_examples.learn_codes.reward_curve import main as reward_curve_main
from memagent_examples.learn_codes.start import DIGESTED_DOORS, SHIPPED, contexts_digest, read_record
from memagent_examples.learn_codes.task import (
    Door,
    build_key,
    demonstration,
    demonstration_samples,
    held_out_doors,
    make_doors,
    single_token_words,
    warm_start,
    write_task,
)
from memagent_examples.learn_codes.warm_start import (
    IGNORE,
    CopyRows,
    ResumePoint,
    adamw_steps,
    copy_batch,
    copy_pretraining,
    distant_copy_batch,
    labelled_loss,
    scripted_samples,
    supervised_steps,
)
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
    then this fails, and the start must be rebuilt and shipped anew (docs/main_job.md)."""
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
    """The main job's starting point, scored as the main job scores it: greedily it answers 10 of
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
    run = dict(retriever_url=url, agent_loops_yaml=str(AGENT_LOOPS), steps=2, batch_size=2, seed=3, copy_steps=1)
    warm_start(tiny_model_dir, out, demos, checkpoint_every=1, **run)
    record = read_record(out)
    assert record["inputs"] == {"seed": 3, "copy_steps": 1, "steps": 2, "lr": 1e-3, "batch_size": 2}
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


def test_a_checkpoint_after_k_steps_is_the_model_of_a_k_step_run(tiny_model_dir, tokenizer):
    """What `warm-start --checkpoint-every` and benchmarks/warm_start_sweep.py rely on."""
    generator = torch.Generator().manual_seed(0)
    samples = [(ids, ids) for ids in torch.randint(5, 200, (6, 24), generator=generator).tolist()]
    run = dict(
        samples=samples, lr=1e-3, batch_size=2, pad_token_id=tokenizer.pad_token_id, extra_rows=(CopyRows(adjacent=1),)
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    saved = {}

    def after_step(step: int) -> None:
        if step == 2:
            saved.update({name: value.detach().clone() for name, value in model.state_dict().items()})

    supervised_steps(model, steps=4, after_step=after_step, **run)
    short = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    supervised_steps(short, steps=2, **run)
    assert saved.keys() == short.state_dict().keys()
    assert all(torch.equal(saved[name], value) for name, value in short.state_dict().items())
    assert not all(torch.equal(saved[name], value) for name, value in model.state_dict().items())


class Killed(Exception):
    """Stands for the SIGKILL that ends a session in the middle of a warm start."""


def test_a_warm_start_killed_and_resumed_ends_with_the_weights_of_one_never_stopped(tiny_model_dir, tmp_path):
    """`warm-start --resume-every`: killed after step 5 (its last save at step 4: step 5 is lost), started
    again, it redoes step 5 from the saved AdamW moments, lr schedule (decaying over the run's last 3 of 6
    steps) and batch sources, and ends bit for bit where an uninterrupted run ends, with the same losses."""
    generator = torch.Generator().manual_seed(3)
    samples = [(ids, ids) for ids in torch.randint(5, 200, (8, 24), generator=generator).tolist()]
    run = dict(samples=samples, steps=6, lr=1e-3, batch_size=2, pad_token_id=0, decay_steps=3, unpadded=True)
    run["extra_rows"] = (CopyRows(adjacent=1),)
    whole = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    whole_losses = supervised_steps(whole, **run)

    resume = ResumePoint(tmp_path / "resume.pt", every=2, identity={"steps": 6})

    def kill_after_step_5(step: int) -> None:
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        supervised_steps(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), after_step=kill_after_step_5, resume=resume, **run
        )
    assert len(torch.load(resume.path, weights_only=False)["losses"]) == 4
    resumed = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    steps_run = []
    resumed_losses = supervised_steps(resumed, after_step=steps_run.append, resume=resume, **run)
    assert steps_run == [5, 6]
    assert resumed_losses == whole_losses
    assert all(torch.equal(value, resumed.state_dict()[name]) for name, value in whole.state_dict().items())

    # the same state under other inputs is refused, with the file and the fix named
    other = ResumePoint(resume.path, every=2, identity={"steps": 7})
    with pytest.raises(ValueError, match="resume.pt holds the state of a run with other inputs.*delete it"):
        supervised_steps(AutoModelForCausalLM.from_pretrained(tiny_model_dir), resume=other, **run)


def test_copy_batch_labels_exactly_the_repeats():
    input_ids, labels = copy_batch(torch.Generator().manual_seed(0), vocab_size=50, batch_size=4, length=64)
    assert input_ids.shape == labels.shape == (4, 64)
    for row_ids, row_labels in zip(input_ids.tolist(), labels.tolist(), strict=True):
        labelled = [i for i, label in enumerate(row_labels) if label != IGNORE]
        assert 0 < len(labelled) < 64
        start = 0
        while start < 64 and row_labels[start] == IGNORE:  # segments: size unlabelled, then its repeat
            size = next((i for i in range(start, 64) if row_labels[i] != IGNORE), 64) - start
            repeat = row_ids[start + size : start + 2 * size]
            assert repeat == row_ids[start : start + len(repeat)]
            assert row_labels[start + size : start + 2 * size] == repeat
            start += 2 * size


def test_distant_copy_batch_labels_exactly_the_copies_at_every_distance():
    input_ids, labels = distant_copy_batch(torch.Generator().manual_seed(0), 50, batch_size=8, length=320, copies=6)
    distances = []
    for row_ids, row_labels in zip(input_ids.tolist(), labels.tolist(), strict=True):
        labelled = [i for i, label in enumerate(row_labels) if label != IGNORE]
        runs = [[labelled[0]]]  # each copy is one run of labels, apart from the others
        for i in labelled[1:]:
            runs[-1].append(i) if i == runs[-1][-1] + 1 else runs.append([i])
        assert len(runs) == 6 and all(4 <= len(run) <= 16 for run in runs)
        for run in runs:
            copy = row_ids[run[0] : run[-1] + 1]
            assert [row_labels[i] for i in run] == copy
            sources = [s for s in range(run[0] - len(copy) + 1) if row_ids[s : s + len(copy)] == copy]
            assert sources, "every labelled run repeats an earlier segment"
            distances.append(run[0] - sources[-1])
    assert min(distances) < 40 and max(distances) > 160  # near and far copies alike
    with pytest.raises(ValueError, match="use >= 320"):
        distant_copy_batch(torch.Generator(), 50, length=100, copies=8)


def test_copy_rows_add_each_kinds_loss(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rows = CopyRows(adjacent=2, distant=1, distant_length=320)
    adjacent = labelled_loss(model, *copy_batch(torch.Generator().manual_seed(3), model.config.vocab_size, 2))
    generator = torch.Generator().manual_seed(3)
    copy_batch(generator, model.config.vocab_size, 2)
    distant = labelled_loss(model, *distant_copy_batch(generator, model.config.vocab_size, 1, 320))
    torch.testing.assert_close(rows.loss(model, torch.Generator().manual_seed(3)), adjacent + distant)
    assert CopyRows().loss(model, torch.Generator()) == 0.0


def test_labelled_loss_is_the_models_own_loss_on_the_labels(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    input_ids, labels = copy_batch(torch.Generator().manual_seed(1), model.config.vocab_size, batch_size=3, length=40)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 30:] = 0  # a right-padded row, its padding unlabelled
    labels[2, 30:] = IGNORE
    expected = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    torch.testing.assert_close(labelled_loss(model, input_ids, labels, attention_mask), expected)


def test_copy_pretraining_updates_the_model(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = model.model.layers[0].self_attn.q_proj.weight.clone()
    losses = copy_pretraining(model, steps=2)
    assert len(losses) == 2 and all(8.0 < loss < 9.0 for loss in losses)  # ~ln(4096) for random tokens
    assert not torch.equal(before, model.model.layers[0].self_attn.q_proj.weight)


@pytest.mark.parametrize("decay_steps, factors", [(0, [1, 1, 1, 1]), (4, [1, 0.75, 0.5, 0.25]), (2, [1, 1, 1, 0.5])])
def test_adamw_steps_keep_or_linearly_decay_the_learning_rate(decay_steps, factors):
    """On a loss of constant gradient Adam's update is the learning rate itself, so each step's change
    shows the rate it took: 0.1 throughout; falling by a quarter a step over all 4 steps; or by half a
    step over the last 2."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(()))
    values = []
    record = lambda _: values.append(model.weight.item())  # noqa: E731
    adamw_steps(model, 4, 0.1, lambda: 3.0 * model.weight, "test", record, decay_steps)
    expected, weight = [], 0.0
    for factor in factors:  # AdamW: the weight shrinks by rate x 0.01 (its default decay), then moves by the rate
        rate = 0.1 * factor
        expected.append(weight - (weight * (1 - rate * 0.01) - rate))
        weight -= expected[-1]
    changes = [before - after for before, after in zip([0.0, *values[:-1]], values, strict=True)]
    assert changes == pytest.approx(expected, abs=1e-6)


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
