"""MEM1's multi-objective composer: seeded, N distinct questions per task, aligned ground truth."""

import pytest

from verl_memagent.data import compose_multi_objective, read_flashrag
from verl_memagent.data.compose import TASK_PREFIX, task_rows


@pytest.fixture(scope="module")
def pool(data_dir):
    return read_flashrag(data_dir / "qa_bamboogle.jsonl")


def test_one_pass_uses_every_question_once(pool):
    rows = compose_multi_objective(pool, 2, seed=0)
    assert len(rows) == len(pool) // 2
    ids = [i for row in rows for i in row["extra_info"]["id"].split("+")]
    assert len(ids) == len(set(ids)) == 2 * len(rows)


def test_ground_truth_lists_follow_the_question_order(pool):
    by_id = {r.id: r for r in pool}
    for row in compose_multi_objective(pool, 3, seed=7, num_tasks=20):
        ids = row["extra_info"]["id"].split("+")
        assert len(set(ids)) == 3 and row["extra_info"]["objectives"] == 3
        assert row["reward_model"]["ground_truth"] == [list(by_id[i].golden_answers) for i in ids]
        question = row["prompt"][0]["content"]
        assert question.startswith(TASK_PREFIX) and question == row["extra_info"]["question"]
        positions = [question.index(by_id[i].question.rstrip("?;")) for i in ids]
        assert positions == sorted(positions)
        assert row["data_source"] == "multi_objective_3" and row["agent_name"] == "mem1"


def test_seeded(pool):
    assert compose_multi_objective(pool, 2, seed=1) == compose_multi_objective(pool, 2, seed=1)
    assert compose_multi_objective(pool, 2, seed=1) != compose_multi_objective(pool, 2, seed=2)


def test_more_tasks_than_one_pass_and_bad_sizes(pool):
    rows = compose_multi_objective(pool[:4], 3, seed=0, num_tasks=10)
    assert len(rows) == 10 and all(len(set(r["extra_info"]["id"].split("+"))) == 3 for r in rows)
    with pytest.raises(ValueError, match="objectives"):
        compose_multi_objective(pool[:2], 3)
    with pytest.raises(ValueError, match="agent"):
        compose_multi_objective(pool, 2, agent="nope")


def test_task_rows_compose_only_when_asked(pool):
    plain = task_rows(pool, "memsearcher", "test")
    assert [row["extra_info"]["question"] for row in plain] == [record.question for record in pool]
    single_tasks = task_rows(pool, "mem1", "test", objectives=1, num_tasks=3, seed=5)
    assert len(single_tasks) == 3
    assert all(row["extra_info"]["question"].startswith(TASK_PREFIX) for row in single_tasks)
    assert all(len(row["reward_model"]["ground_truth"]) == 1 for row in single_tasks)
    composed = compose_multi_objective(pool, 2, split="test", seed=5)
    assert task_rows(pool, "mem1", "test", objectives=2, seed=5) == composed
    with pytest.raises(ValueError, match="objectives: expected a positive number"):
        task_rows(pool, "mem1", "test", objectives=0)
