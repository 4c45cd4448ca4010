"""`verl-memagent merge` refuses what is not one complete save, naming what it found (the join itself runs
on real two-rank checkpoints in tests/cpu/test_recipes_cpu.py)."""

from __future__ import annotations

import pytest

from verl_memagent.merge import shard_files


def test_the_shards_of_one_save_in_rank_order(tmp_path):
    for rank in (1, 0):
        (tmp_path / f"model_world_size_2_rank_{rank}.pt").write_bytes(b"")
    assert [path.name for path in shard_files(tmp_path)] == [
        "model_world_size_2_rank_0.pt",
        "model_world_size_2_rank_1.pt",
    ]


def test_a_missing_rank_or_a_mix_of_saves_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"found world sizes none: point at a checkpoint's actor directory"):
        shard_files(tmp_path)
    (tmp_path / "model_world_size_4_rank_0.pt").write_bytes(b"")
    (tmp_path / "model_world_size_4_rank_2.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"the shards of ranks \[1, 3\] of 4 are missing"):
        shard_files(tmp_path)
    (tmp_path / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"found world sizes \[2, 4\]"):
        shard_files(tmp_path)
