"""Record files (write, find, read with errors that name the line and field) and the page's pieces."""

from __future__ import annotations

import base64
import gzip
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_memagent.trajectories.files import read_records, record_files, records_path, write_records
from verl_memagent.trajectories.report import memory_diff, render_page, select_steps, show


def test_files_are_named_by_source_and_step(tmp_path):
    assert records_path(tmp_path, "train", 3).name == "step_3.jsonl"
    assert records_path(tmp_path, "validation", 0).name == "validation_step_0.jsonl"
    assert records_path(tmp_path, "eval").name == "eval.jsonl"


def test_records_round_trip_and_are_found_from_the_run_dir(played_steps, tmp_path):
    records = played_steps[1]
    path = write_records(records_path(tmp_path / "trajectories", "train", 1), records)
    assert read_records(path) == records
    assert not list(path.parent.glob(".*partial"))  # written whole, then renamed
    assert record_files(tmp_path) == record_files(tmp_path / "trajectories") == record_files(path) == [path]
    with pytest.raises(ValueError, match="no trajectory records"):
        record_files(tmp_path.parent)
    with pytest.raises(ValueError, match="no such file or directory"):
        record_files(tmp_path / "missing")


def test_a_version_1_file_reads_back_with_no_weight_versions_nor_statements(played_steps, tmp_path):
    """Version 2 added each turn's `weight_versions`, version 3 its retention by statements; a file written by
    version 1 has none of them."""
    path = write_records(records_path(tmp_path, "train", 1), played_steps[1])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        assert line["schema_version"] == 3
        line["schema_version"] = 1
        for turn in line["turns"]:
            for added in ("weight_versions", "statements_read", "statements_held"):
                del turn[added]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    old = read_records(path)
    assert [r.schema_version for r in old] == [1] * len(lines)
    assert all(turn.weight_versions is None and turn.statements_read is None for r in old for turn in r.turns)


def test_a_bad_line_is_named_with_its_field(played_steps, tmp_path):
    good = played_steps[1][0].model_dump(mode="json")
    bad = json.loads(json.dumps(good))
    bad["turns"][1]["context_tokens"] = "many"
    path = tmp_path / "step_1.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(
        ValueError, match=r"step_1.jsonl:2: field 'turns.1.context_tokens': Input should be a valid integer"
    ):
        read_records(path)
    del bad["turns"]
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r":1: field 'turns': Field required"):
        read_records(path)


def test_steps_are_chosen_by_number_first_and_last():
    assert select_steps([1, 2, 5, 9], "all") == {1, 2, 5, 9}
    assert select_steps([1, 2, 5, 9], "first,last") == {1, 9}
    assert select_steps([1, 2, 5, 9], "2, 5") == {2, 5}
    with pytest.raises(ValueError, match="--steps 'latest'"):
        select_steps([1], "latest")


def test_show_keeps_eval_records_and_the_chosen_steps(played_steps, tmp_path):
    directory = tmp_path / "trajectories"
    for step, records in played_steps.items():
        write_records(records_path(directory, "train", step), records)
    evaluated = [r.model_copy(update={"source": "eval", "step": None}) for r in played_steps[1][:2]]
    write_records(records_path(directory, "eval"), evaluated)
    page = show([tmp_path], tmp_path / "page.html", steps="last", max_per_step=3).read_text()
    index = json.loads(re.search(r'<script type="application/json" id="index">(.*?)</script>', page).group(1))
    assert [(g["label"], g["count"]) for g in index["groups"]] == [("train step 2", 3), ("eval", 2)]
    with pytest.raises(ValueError, match="no records of steps '7'"):
        show([tmp_path / "trajectories" / "step_1.jsonl"], tmp_path / "none.html", steps="7")


def test_the_page_embeds_each_step_compressed_and_escapes_the_title(played_steps):
    page = render_page(played_steps[1], title="<run> & co")
    assert "<title>&lt;run&gt; &amp; co</title>" in page
    (block,) = re.findall(r'<script type="application/gzip" id="data-g0">(.*?)</script>', page)
    shown = json.loads(gzip.decompress(base64.b64decode(block)))
    assert [r["trajectory_id"] for r in shown] == [r.trajectory_id for r in played_steps[1]]
    first = shown[0]["turns"]
    assert first[1]["diff"] == memory_diff(first[1]["memory_before"], first[1]["memory"])
    assert "__DATA__" not in page and "__TITLE__" not in page


memories = st.lists(
    st.sampled_from(["Leer", "Leda", "river", "Old", "Frisian", "8th", "  ", "\n", "lies"]), max_size=30
)


@given(memories.map(" ".join), memories.map(" ".join))
def test_memory_diff_rebuilds_both_memories(before, after):
    pieces = memory_diff(before, after)
    assert {piece[0] for piece in pieces} <= {"=", "-", "+"}
    now = "".join(piece[1] for piece in pieces if piece[0] != "-")
    was = "".join(piece[-1] for piece in pieces if piece[0] != "+")
    assert now.split() == after.split() and was.split() == before.split()
    if after.strip() and before.strip():
        assert (now, was) == (after, before)


def test_memory_diff_without_memory():
    assert memory_diff(None, None) is None  # react keeps no memory
    assert memory_diff("kept as it was", None) == [["=", "kept as it was"]]
    assert memory_diff("", "first notes") == [["+", "first notes"]]
