"""The evaluated tasks: FlashRAG files, MEM1's composed tasks and prepared parquet reach `run()` the same way."""

from __future__ import annotations

import json

import pytest

from verl_memagent.data.compose import TASK_PREFIX
from verl_memagent.data.flashrag import read_flashrag
from verl_memagent.data.prepare import prepare, write_parquet
from verl_memagent.eval.tasks import load_datasets, worker_kwargs


def test_datasets_are_named_limited_and_validated(data_dir, tmp_path):
    path = data_dir / "qa_bamboogle.jsonl"
    datasets = load_datasets([f"bamboo={path}", str(data_dir / "qa_multihop.jsonl")], limit=3)
    assert {name: len(rows) for name, rows in datasets.items()} == {"bamboo": 3, "qa_multihop": 3}
    first = json.loads(path.read_text().splitlines()[0])
    assert datasets["bamboo"][0]["extra_info"]["question"] == first["question"]
    assert datasets["bamboo"][0]["reward_model"]["ground_truth"] == first["golden_answers"]
    with pytest.raises(ValueError, match="given twice"):
        load_datasets([f"x={path}", f"x={path}"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q?"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: field 'golden_answers'"):
        load_datasets([str(bad)])
    with pytest.raises(ValueError, match="--objectives: expected a positive number"):
        load_datasets([str(path)], objectives=0)


def test_num_tasks_composes_even_one_objective_tasks(data_dir):
    path = data_dir / "qa_bamboogle.jsonl"
    (tasks,) = load_datasets([str(path)], objectives=1, num_tasks=4, seed=5).values()
    records = {record.id: record for record in read_flashrag(path)}
    assert len(tasks) == 4 and len({row["extra_info"]["id"] for row in tasks}) == 4
    for row in tasks:
        record = records[row["extra_info"]["id"]]
        assert row["reward_model"]["ground_truth"] == [list(record.golden_answers)]
        assert row["extra_info"]["question"] == f"{TASK_PREFIX}{record.question.rstrip('?;')}?"
    (more,) = load_datasets([str(path)], objectives=1, num_tasks=9, seed=5).values()
    assert more[:4] == tasks  # --limit K and --num-tasks K give the same first tasks


@pytest.mark.parametrize("objectives", [1, 2])
def test_composed_on_the_fly_equals_the_prepared_parquet(data_dir, tmp_path, objectives):
    source = data_dir / "qa_multihop.jsonl"
    parquet, _ = prepare([f"mh={source}"], tmp_path / "mh.parquet", "mem1", split="test", objectives=objectives, seed=7)
    composed = load_datasets([f"mh={source}"], objectives=objectives, seed=7)["mh"]
    prepared = load_datasets([f"mh={parquet}"], objectives=5, seed=1)["mh"]  # a parquet is used as it is
    assert len(composed) == len(read_flashrag(source)) // objectives
    assert [worker_kwargs(row, "react") for row in prepared] == [worker_kwargs(row, "react") for row in composed]
    if objectives > 1:  # N gold lists per task, drawn by the seed
        assert all(len(row["reward_model"]["ground_truth"]) == objectives for row in composed)
        assert load_datasets([f"mh={source}"], objectives=objectives, seed=8)["mh"] != composed


def test_worker_kwargs_are_what_verls_dataset_hands_the_worker(data_dir, tmp_path, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_memagent.agent import verl_trainer_config

    parquet, _ = prepare([str(data_dir / "qa_multihop.jsonl")], tmp_path / "t.parquet", "mem1", objectives=2, limit=6)
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tokenizer, config=verl_trainer_config().data)
    (rows,) = load_datasets([str(parquet)]).values()
    assert len(rows) == len(dataset) == 3
    for index, row in enumerate(rows):
        verl_row = dataset[index]
        verl_row.pop("dummy_tensor")  # a tensor: verl's batch, not the non-tensor kwargs of run()
        assert worker_kwargs(row, "react") == {**verl_row, "agent_name": "react"}


def test_a_parquet_without_ground_truth_is_refused(tmp_path):
    row = {"prompt": [{"role": "user", "content": "q?"}], "extra_info": {"question": "q?"}}
    bad = write_parquet([row], tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="row 0: field 'reward_model.ground_truth' missing"):
        load_datasets([str(bad)])
