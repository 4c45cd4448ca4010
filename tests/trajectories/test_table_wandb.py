"""The tracker table: one row per trajectory, logged to wandb in offline mode and read back from its files."""

from __future__ import annotations

from verl_memagent.trajectories.table import COLUMNS, log_to_trackers, read_offline_tables, table_rows, trajectory_text


def test_rows_are_whole_trajectories_with_readable_turns(played_steps):
    records = played_steps[1]
    rows = table_rows(records)
    assert len(rows) == len(records) and all(len(row) == len(COLUMNS) for row in rows)
    first = dict(zip(COLUMNS, rows[0], strict=True))
    assert first["turns"] == 3 and first["trajectory_id"] == records[0].trajectory_id
    text = trajectory_text(records[0])
    turn_blocks = text.split("\n\n")
    assert [block.splitlines()[0].split(" (")[0] for block in turn_blocks[:3]] == ["Turn 1", "Turn 2", "Turn 3"]
    assert "query: Leda river Leer settlement" in turn_blocks[0]
    assert f"memory written: {records[0].turns[0].memory}" in turn_blocks[0]
    assert f"memory before: {records[0].turns[0].memory}" in turn_blocks[1]
    assert turn_blocks[-1] == "finished: answer; answer: between the 8th and 16th centuries"


def test_wandb_offline_run_logs_a_table_per_step(played_steps, tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.init(project="memagent-trajectories", dir=tmp_path)
    try:
        for step, records in played_steps.items():
            log_to_trackers(["console", "wandb"], records, "train", step)
            log_to_trackers(["console", "file"], records, "validation", step)  # wandb is not a logger here
            wandb.log({"reward": 1.0}, step=step)  # as verl's Tracking logs the step's metrics after
    finally:
        wandb.finish()

    tables = read_offline_tables(tmp_path / "wandb", "train")
    assert [table["columns"] for table in tables] == [COLUMNS, COLUMNS]
    for table, (step, records) in zip(tables, played_steps.items(), strict=True):
        assert table["data"] == table_rows(records)
        assert {row[0] for row in table["data"]} == {step}
    assert read_offline_tables(tmp_path / "wandb", "validation") == []
