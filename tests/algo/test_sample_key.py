"""`SampleKey`: verl's sample key `{uid}_{session}_{index}`, read one at a time and a batch at a time alike."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_memagent.algo.sample_key import SampleKey


def test_a_key_names_its_group_trajectory_and_turn_even_with_underscores_in_the_uid():
    key = SampleKey.parse("3f2a_b_12_4")
    assert key == SampleKey("3f2a_b", 12, 4) and key.trajectory == "3f2a_b_12"
    assert f"{key.trajectory}_{key.index}" == "3f2a_b_12_4"


@pytest.mark.parametrize("key", ["uid", "uid_1", "uid_x_1", "uid_1_-1", "_1_"])
def test_a_key_not_of_verls_format_is_refused_by_name(key):
    with pytest.raises(ValueError, match=f"sample key '{key}' is not verl's"):
        SampleKey.parse(key)


uids = st.text(alphabet="abc_-0123456789", min_size=1, max_size=8)


@given(st.lists(st.tuples(uids, st.integers(0, 99), st.integers(0, 99)), max_size=30), st.data())
def test_the_columns_of_a_batch_are_what_parse_reads_key_by_key(parts, data):
    keys = [f"{uid}_{session}_{index}" for uid, session, index in parts]
    where = np.array(data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys))), dtype=bool)
    uid_column, sessions, indices = SampleKey.columns(keys, where)
    expected = [SampleKey.parse(key) for key, keep in zip(keys, where, strict=True) if keep]
    assert list(zip(uid_column.to_pylist(), sessions.tolist(), indices.tolist(), strict=True)) == expected


def test_a_batch_names_its_first_bad_key_and_skips_the_ones_left_out():
    keys = ["a_0_0", "padding", "b_x_1", "c_1_1"]
    with pytest.raises(ValueError, match="sample key 'b_x_1' is not verl's"):
        SampleKey.columns(keys, np.array([True, False, True, True]))
    uids, sessions, indices = SampleKey.columns(keys, np.array([True, False, False, True]))
    assert (uids.to_pylist(), sessions.tolist(), indices.tolist()) == (["a", "c"], [0, 1], [0, 1])
