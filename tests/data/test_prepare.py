"""FlashRAG JSON lines -> verl parquet, read back by verl's own RLHFDataset."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from verl_memagent.cli import main as cli_main
from verl_memagent.data import read_flashrag, to_verl_rows
from verl_memagent.data.prepare import prepare


def test_bundled_multihop_rows(data_dir):
    records = read_flashrag(data_dir / "qa_multihop.jsonl")
    assert len(records) == 792
    assert {r.source for r in records} == {"hotpotqa", "musique", "2wikimultihopqa"} or len(
        {r.source for r in records}
    ) == 3
    rows = to_verl_rows(records, "memsearcher", "dev")
    first = rows[0]
    assert first["prompt"] == [{"role": "user", "content": records[0].question}]
    assert first["reward_model"] == {"style": "rule", "ground_truth": list(records[0].golden_answers)}
    assert first["extra_info"] == {"index": 0, "id": records[0].id, "question": records[0].question, "split": "dev"}
    assert first["agent_name"] == "memsearcher" and first["data_source"] == records[0].source


def test_cli_names_sources_and_shuffles_reproducibly(data_dir, tmp_path, capsys):
    out = tmp_path / "bamboogle.parquet"
    args = ["prepare", "--input", f"bamboogle={data_dir / 'qa_bamboogle.jsonl'}", "--out", str(out), "--agent", "react"]
    assert cli_main([*args, "--shuffle", "--seed", "3", "--limit", "10"]) == 0
    assert "wrote 10 rows" in capsys.readouterr().out
    table = pq.read_table(out).to_pylist()
    assert {row["data_source"] for row in table} == {"bamboogle"} and {row["agent_name"] for row in table} == {"react"}
    again = tmp_path / "again.parquet"
    prepare([f"bamboogle={data_dir / 'qa_bamboogle.jsonl'}"], again, "react", shuffle=True, seed=3, limit=10)
    assert pq.read_table(again).to_pylist() == table
    other, _ = prepare([str(data_dir / "qa_bamboogle.jsonl")], tmp_path / "o.parquet", "react", shuffle=True, seed=4)
    assert [r["extra_info"]["id"] for r in pq.read_table(other).to_pylist()[:10]] != [
        r["extra_info"]["id"] for r in table
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "x", "golden_answers": ["a"]}', "'question' must be a non-empty string"),
        ('{"id": "x", "question": "q?", "golden_answers": []}', "'golden_answers' must be a non-empty list"),
        ('{"id": "x", "question": "q?", "golden_answers": [1]}', "'golden_answers' must be a non-empty list"),
        ("not json", "not a JSON object"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": "ok", "question": "q?", "golden_answers": ["a"]}) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl:2: .*{message}"):
        read_flashrag(path)


def test_verl_dataset_reads_the_parquet(data_dir, tmp_path, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_memagent.agent import verl_trainer_config
    from verl_memagent.agent.trajectory import question_of

    out, _ = prepare([str(data_dir / "qa_multihop.jsonl")], tmp_path / "mh.parquet", "mem1", limit=5)
    config = verl_trainer_config().data
    dataset = RLHFDataset(data_files=[str(out)], tokenizer=tokenizer, config=config, processor=None)
    assert len(dataset) == 5
    row = dataset[2]
    records = read_flashrag(data_dir / "qa_multihop.jsonl")
    assert row["agent_name"] == "mem1"
    assert list(row["reward_model"]["ground_truth"]) == list(records[2].golden_answers)
    assert question_of(row) == records[2].question


def test_prepare_imports_neither_verl_nor_torch(data_dir, tmp_path):
    # every recipe and many tests run it before verl's trainer: importing the eval command's verl with it
    # cost 6 of its 7.5 s
    probe = (
        "import json, sys; from verl_memagent.cli import main; "
        f"main(['prepare', '--input', {str(data_dir / 'qa_multihop.jsonl')!r}, '--agent', 'memsearcher', "
        f"'--limit', '2', '--out', {str(tmp_path / 'train.parquet')!r}]); "
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert loaded.isdisjoint({"verl", "torch", "transformers", "tensordict"}), loaded
