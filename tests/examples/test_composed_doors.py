"""`memagent_examples.composed_doors`: the composed password task, its door sets, each agent's demonstrations and
warm start, and the shipped starts' records."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
import torch

from memagent_examples.build_records import contexts_digest, read_record
from memagent_examples.composed_doors.task import (
    PASSAGE_WORDS,
    PROMPT_LENGTH,
    RESPONSE_LENGTH,
    SETS,
    fresh_rl_rows,
    make_door_sets,
    read_door_sets,
    write_door_sets,
)
from memagent_examples.composed_doors.warm_start import (
    DEMO_OBJECTIVES,
    DIGESTED_SAMPLES,
    SEARCH_THOUGHT,
    SHIPPED_STARTS,
    WARM_STEPS,
    AnswerRows,
    agent_format,
    composed_options,
    composed_texts,
    demonstration_scripts,
    warm_start_agent,
)
from memagent_examples.retriever_process import build_command
from memagent_examples.scripted import ScriptedPolicy
from memagent_examples.warm_start import scripted_samples
from verl_memagent.agent import instantiate_agent_loop, verl_trainer_config, verl_worker_row
from verl_memagent.data.compose import TASK_PREFIX
from verl_memagent.output_fields import FinishReason, OutputField
from verl_memagent.reward.scores import multi_objective_em

REPO = Path(__file__).resolve().parents[2]
AGENT_LOOPS = REPO / "recipes" / "cpu" / "composed_doors_agent_loops.yaml"
WORDS = [f"w{i:02d}" for i in range(40)]


def names(doors) -> set[tuple[str, str]]:
    return {(door.station, door.gate) for door in doors}


SIZES = {"stations": 6, "gates": 5, "passwords": 4, "rl": 6, "dev": 6, "unseen_stations": 3, "unseen_gates": 2}
SIZES |= {"pool_side": 4, "test_side": 3}


def words_of(doors) -> set[str]:
    return {word for door in doors for word in (door.station, door.gate)}


def test_door_sets_are_disjoint_and_dev_pairs_are_of_known_words():
    sets = make_door_sets(WORDS, **SIZES)
    assert [len(sets.of(name)) for name in SETS] == [18, 6, 6, 6, 16, 9]
    for i, first in enumerate(SETS):
        for second in SETS[i + 1 :]:
            assert not names(sets.of(first)) & names(sets.of(second)), (first, second)
    trained = sets.trained_words()
    assert words_of(sets.dev) <= trained
    assert not words_of(sets.unseen) & trained and not words_of(sets.test) & trained
    # the fresh sets share no word with any other set, nor with each other
    for fresh in ("rl_pool", "test"):
        others = set().union(*(words_of(sets.of(name)) for name in SETS if name != fresh))
        assert not words_of(sets.of(fresh)) & others, fresh
    passwords = {door.password for name in SETS for door in sets.of(name)}
    assert len(passwords) <= 4 and not passwords & set().union(*(words_of(sets.of(name)) for name in SETS))


def test_the_fresh_sets_leave_the_first_four_as_they_were():
    """The shipped warm starts and the committed records grew from the first four sets: drawing the two
    fresh sets (a generator of their own, after the others) changes none of them."""
    before = make_door_sets(WORDS, **{**SIZES, "pool_side": 0, "test_side": 0})
    after = make_door_sets(WORDS, **SIZES)
    assert [before.of(name) for name in SETS[:4]] == [after.of(name) for name in SETS[:4]]


def test_door_sets_are_seeded():
    assert make_door_sets(WORDS, seed=1, **SIZES) == make_door_sets(WORDS, seed=1, **SIZES)
    assert make_door_sets(WORDS, seed=1, **SIZES) != make_door_sets(WORDS, seed=2, **SIZES)
    with pytest.raises(ValueError, match="too few"):
        make_door_sets(WORDS[:30], **SIZES)
    with pytest.raises(ValueError, match="no demonstration doors"):
        make_door_sets(WORDS, **{**SIZES, "rl": 20, "dev": 10})


def test_fresh_rl_questions_ask_no_door_twice_and_cycle_through_k():
    pool = make_door_sets(WORDS, **{**SIZES, "pool_side": 5}).rl_pool  # 25 doors
    rows = fresh_rl_rows(pool, "mem1", (1, 2, 4), tasks=6, seed=3)  # 1 + 2 + 4 + 1 + 2 + 4 = 14 doors
    assert [row["extra_info"]["objectives"] for row in rows] == [1, 2, 4, 1, 2, 4]
    assert [row["data_source"] for row in rows][:3] == ["multi_objective_1", "multi_objective_2", "multi_objective_4"]
    asked = [door_id for row in rows for door_id in row["extra_info"]["id"].split("+")]
    assert len(asked) == len(set(asked)) == 14
    questions = {door.question.rstrip("?") for door in pool}
    for row in rows:
        assert all(
            part.rstrip("?") in questions
            for part in row["extra_info"]["question"].removeprefix(TASK_PREFIX).split("; ")
        )
    assert rows != fresh_rl_rows(pool, "mem1", (1, 2, 4), tasks=6, seed=4)  # another seed deals other doors
    with pytest.raises(ValueError, match="need 28 doors; the pool has 25"):
        fresh_rl_rows(pool, "mem1", (1, 2, 4), tasks=12, seed=3)


def served_task(out: Path, retriever_server, tokenizer, **sizes):
    sets = write_door_sets(out / "task", tokenizer, REPO / "data" / "corpus.jsonl", seed=0, **sizes)
    subprocess.run(build_command("bm25", out / "task" / "corpus.jsonl", out / "bm25"), check=True, cwd=REPO)
    return out / "task", sets, retriever_server(out / "bm25").url


@pytest.fixture(scope="module")
def task(tmp_path_factory, retriever_server, tokenizer):
    """The task as the sweep writes it (the tiny tokenizer's words, the bundled corpus), served by BM25."""
    return served_task(tmp_path_factory.mktemp("composed_doors"), retriever_server, tokenizer)


@pytest.fixture(scope="module")
def starts_task(tmp_path_factory, retriever_server, tokenizer):
    """The task the shipped warm starts were built on: the first four door sets, before `rl_pool` and `test`
    added their passages to the corpus (which changes what BM25 ranks second and third for some queries)."""
    return served_task(tmp_path_factory.mktemp("starts_task"), retriever_server, tokenizer, pool_side=0, test_side=0)


def test_written_task_states_each_password_in_one_long_passage(task, tokenizer):
    task_dir, sets, _ = task
    assert read_door_sets(task_dir) == sets
    passages = {}
    for line in (task_dir / "corpus.jsonl").read_text().splitlines():
        row = json.loads(line)
        passages.setdefault(row["id"], row["contents"])
    for name in SETS:
        rows = [json.loads(line) for line in (task_dir / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == len(sets.of(name))
        for row, door in zip(rows, sets.of(name), strict=True):
            assert (row["question"], row["golden_answers"]) == (door.question, [door.password])
            passage = passages[row["id"]]
            assert passage.startswith(f'"station {door.station} gate {door.gate}"\n') and door.statement in passage
            words = len(passage.split("\n", 1)[1].split()) - len(door.statement.split())
            assert PASSAGE_WORDS - 10 <= words <= PASSAGE_WORDS
    statements = [json.loads(line)["contents"] for line in (task_dir / "corpus.jsonl").read_text().splitlines()]
    for door in sets.dev[:20] + sets.test[:20]:  # the statement of each door is in its own passage only
        assert sum(door.statement in text for text in statements) == 1


async def play(agent, texts, question, tokenizer, url):
    config = verl_trainer_config(prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH)
    policy = ScriptedPolicy(tokenizer, texts)
    loop = instantiate_agent_loop(agent, config, policy, tokenizer, "qwen2", path=AGENT_LOOPS, retriever_urls=url)
    outputs = await loop.run({"temperature": 1.0, "logprobs": False}, **verl_worker_row(question))
    return outputs if isinstance(outputs, list) else [outputs], policy


@pytest.mark.parametrize("agent", ["memsearcher", "mem1", "react"])
def test_composed_task_through_each_agent_loop_and_reward(task, tokenizer, agent):
    """A held-out two-door question played in the agent's own format through its real loop and the real
    retriever scores 2 under MEM1's sum-EM reward; one wrong password scores 1."""
    _, sets, url = task
    model = agent_format(agent, tokenizer, "qwen2", str(AGENT_LOOPS), url)
    doors = sets.dev[:2]
    question = TASK_PREFIX + "; ".join(door.question for door in doors)
    truth = [[door.password] for door in doors]
    outputs, policy = asyncio.run(play(agent, composed_texts(model, doors), question, tokenizer, url))
    final = outputs[-1].extra_fields
    assert final[OutputField.FINISH_REASON] == FinishReason.ANSWER and len(policy.calls) == len(policy.texts)
    seen = tokenizer.decode(policy.calls[-1]["prompt_ids"])
    assert all(door.statement in seen for door in doors)  # memory, state or history carries both passwords
    assert multi_objective_em("composed", "", truth, final)["score"] == 2.0
    wrong = [*composed_texts(model, doors)[:-1], composed_texts(model, [doors[0], sets.dev[5]])[-1]]
    if doors[1].password != sets.dev[5].password:
        outputs, _ = asyncio.run(play(agent, wrong, question, tokenizer, url))
        assert multi_objective_em("composed", "", truth, outputs[-1].extra_fields)["score"] == 1.0


def test_demonstrations_cover_each_objective_count_in_the_agents_format(task, tokenizer):
    _, sets, url = task
    model = agent_format("mem1", tokenizer, "qwen2", str(AGENT_LOOPS), url)
    scripts = demonstration_scripts(model, sets.demos, tasks_per_objective=3, seed=0)
    assert len(scripts) == 3 * len(DEMO_OBJECTIVES)
    for (question, texts), k in zip(scripts, [k for k in DEMO_OBJECTIVES for _ in range(3)], strict=True):
        assert question.startswith(TASK_PREFIX) and question.count("What is the password") == k
        assert len(texts) == k + 1 and all("<search>" in text for text in texts[:-1]) and "<answer>" in texts[-1]
    assert scripts == demonstration_scripts(model, sets.demos, tasks_per_objective=3, seed=0)


def test_warm_start_trains_on_the_loops_samples_and_checkpoints(task, tiny_model_dir, tmp_path):
    task_dir, _, url = task
    out = tmp_path / "warm"
    options = composed_options(2, checkpoint_every=1, resume_every=1)
    losses = warm_start_agent("react", tiny_model_dir, out, task_dir, url, str(AGENT_LOOPS), options, 2, (1, 2))
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert not (out / "resume.pt").exists()  # the state kept at step 1 for a resume goes once the model is saved
    for saved, steps in ((out / "step_1", 1), (out / "step_2", 2), (out, 2)):
        record = json.loads((saved / "build.json").read_text())
        assert (saved / "model.safetensors").is_file() and record["inputs"]["steps"] == steps
        assert record["inputs"]["agent"] == "react" and record["samples"] == 4  # react: one sample a trajectory
        assert record["contexts"]["samples"] == 4  # the digest covers what there is, up to DIGESTED_SAMPLES


@pytest.mark.parametrize("agent", ["memsearcher", "mem1", "react"])
def test_the_agent_loops_build_the_contexts_each_shipped_start_learned(starts_task, tokenizer, agent):
    """A prompt, template, format or door change shows a shipped warm start contexts it was not trained
    on: then this fails, and the starts must be rebuilt (`papers_claim.py --start build`) and shipped anew."""
    task_dir, sets, url = starts_task
    record = read_record(SHIPPED_STARTS / agent)
    inputs = record["inputs"]
    assert (inputs["agent"], inputs["steps"], inputs["seed"]) == (agent, WARM_STEPS, 0)  # the task fixture's seed
    model = agent_format(agent, tokenizer, "qwen2", str(AGENT_LOOPS), url)
    scripts = demonstration_scripts(model, sets.demos, inputs["tasks_per_objective"], 0, inputs["objectives"])
    digested = record["contexts"]["samples"]  # the first contexts; 64 questions (k = 1) make at least 64
    assert digested == DIGESTED_SAMPLES <= record["samples"]
    lengths = (PROMPT_LENGTH, RESPONSE_LENGTH)
    samples = asyncio.run(
        scripted_samples(agent, scripts[:64], tokenizer, str(AGENT_LOOPS), *lengths, "qwen2", retriever_urls=url)
    )
    assert contexts_digest(samples[:digested]) == record["contexts"]["sha256"]


@pytest.mark.parametrize("agent", ["memsearcher", "mem1", "react"])
def test_answer_rows_end_in_the_agents_answer_to_the_statements_they_hold(task, tokenizer, agent):
    """Each row states 1-8 values (the most a demonstration asks) as " is V." and ends in the agent's own
    answer to them, in order; only the answer and its closer are labelled."""
    _, sets, url = task
    model = agent_format(agent, tokenizer, "qwen2", str(AGENT_LOOPS), url)
    rows = AnswerRows.of(model, tokenizer, rows=64)
    passwords = [sets.demos[0].password, sets.demos[1].password]
    answer_ids = [*tokenizer(" " + passwords[0]).input_ids, *rows.separator, *tokenizer(" " + passwords[1]).input_ids]
    spelled = tokenizer.decode([*rows.opener, *answer_ids, *rows.closer])
    assert model.answer("thought", " " + "; ".join(passwords), "notes").endswith(spelled)

    input_ids, labels = rows.batch(torch.Generator().manual_seed(0), len(tokenizer))
    counts = set()
    for ids, row_labels in zip(input_ids.tolist(), labels.tolist(), strict=True):
        labelled = [i for i, label in enumerate(row_labels) if label != -100]
        answer = ids[labelled[0] : len(ids) - len(rows.closer)]
        values = answer[:: len(rows.separator) + 1]
        step = len(rows.separator) + 1
        assert all(answer[i + 1 : i + step] == list(rows.separator) for i in range(0, len(answer) - 1, step))
        assert labelled == list(range(len(ids) - len(answer) - len(rows.closer), len(ids)))
        assert ids[labelled[0] - len(rows.opener) : labelled[0]] == list(rows.opener)
        assert ids[len(ids) - len(rows.closer) :] == list(rows.closer)
        is_id, stop = rows.statement_end
        stated = [
            ids[i + 1] for i in range(labelled[0] - len(rows.opener) - 2) if ids[i] == is_id and ids[i + 2] == stop
        ]
        remaining = iter(stated)  # the values are stated in the answer's order (filler may state more)
        assert all(value in remaining for value in values)
        counts.add(len(values))
    assert rows.statements == max(DEMO_OBJECTIVES) == 8 and counts == set(range(1, 9))


def test_records_and_the_page_count_what_a_memory_holds_by_statements(task, tokenizer, browser, tmp_path):
    """Two doors sharing their password, as most do at k = 8: MemSearcher's demonstration restates each door's
    statement in its memory, so every statement read is held; a memory keeping the passwords without their
    doors holds every answer but no statement. The records count both, and the page shows them."""
    from browsing import open_page
    from selenium.webdriver.common.by import By

    from verl_memagent.trajectories.build import ContextSample, build_record
    from verl_memagent.trajectories.report import write_report

    _, sets, url = task
    doors = next(  # no station or gate in common: a search for one finds only its own statement
        (a, b)
        for i, a in enumerate(sets.dev)
        for b in sets.dev[i + 1 :]
        if a.password == b.password and a.station != b.station and a.gate != b.gate
    )
    question = TASK_PREFIX + "; ".join(door.question for door in doors)
    truth = [[door.password] for door in doors]
    model = agent_format("memsearcher", tokenizer, "qwen2", str(AGENT_LOOPS), url)
    passwords_only = [
        *model.search(SEARCH_THOUGHT, f"password of {doors[0].name}", doors[0].password + "."),
        *model.search(SEARCH_THOUGHT, f"password of {doors[1].name}", f"{doors[0].password}. {doors[1].password}."),
        model.answer("", " " + "; ".join(door.password for door in doors), ""),
    ]
    records = []
    for texts in (composed_texts(model, doors), passwords_only):
        outputs, _ = asyncio.run(play("memsearcher", texts, question, tokenizer, url))
        contexts = [ContextSample(o.prompt_ids, o.response_ids, o.extra_fields) for o in outputs]
        records.append(
            build_record(
                contexts, tokenizer, source="eval", step=None, data_source="dev_k2", golden_answers=truth, reward=2.0
            )
        )
    counts = [
        [(t.answers_held, t.answers_read, t.statements_held, t.statements_read) for t in r.turns[:2]] for r in records
    ]
    assert counts[0] == [(2, 2, 1, 1), (2, 2, 2, 2)]  # one password read is both doors' answer
    assert counts[1] == [(2, 2, 0, 1), (2, 2, 0, 2)]

    find = open_page(browser, write_report(records, tmp_path / "page.html"))
    find(".trajectory .summary")[1].click()
    cards = [card.find_elements(By.CSS_SELECTOR, ".turn") for card in find(".trajectory")]
    # (the headings are shown in capitals)
    assert "holds 2 of the 2 answers read so far; 2 of the 2 statements" in cards[0][1].text.lower()
    assert "holds 2 of the 2 answers read so far; 0 of the 2 statements" in cards[1][1].text.lower()
