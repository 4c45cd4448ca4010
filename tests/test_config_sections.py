"""The config sections the plugin adds take only values of their fields' types, and say which key is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_memagent.agent.settings import build_settings
from verl_memagent.algo.config import MultiContextConfig
from verl_memagent.algo.trajectory_records import TrajectoryRecordsConfig


def multi_context(**section):
    return MultiContextConfig.from_algorithm(OmegaConf.create({"multi_context": section}))


def trajectories(**section):
    return TrajectoryRecordsConfig.from_trainer(OmegaConf.create({"trajectories": section}))


def agent_settings(**section):
    return build_settings("mem1", {}, section)


WHERE = {
    multi_context: "algorithm.multi_context",
    trajectories: "trainer.trajectories",
    agent_settings: "mem1 agent settings",
}


@pytest.mark.parametrize(
    ("build", "key", "value", "expected"),
    [
        (multi_context, "weight_trajectories", "yes", "true or false"),
        (multi_context, "turn_discount", "0.9", "a number"),
        (trajectories, "per_step", True, "an integer"),
        (trajectories, "per_step", 2.0, "an integer"),
        (trajectories, "dir", 3, "a string or null"),
        (agent_settings, "require_state", "yes", "true or false"),
        (agent_settings, "stop", "</a>", "a list of strings or null"),
        (agent_settings, "topk", "5", "an integer"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_key(build, key, value, expected):
    with pytest.raises(ValueError) as error:
        build(**{key: value})
    assert str(error.value) == f"{WHERE[build]}: {key}: expected {expected}, got {value!r}"


def test_values_of_the_fields_types_pass_and_an_integer_is_a_number():
    assert multi_context(weight_trajectories=True, turn_discount=1).turn_discount == 1.0
    assert trajectories(per_step=0, dir=None) == TrajectoryRecordsConfig(per_step=0, dir=None)
    settings = agent_settings(
        require_state=True, stop=["</a>"], retriever_timeout_s=5, retriever_urls="http://a,http://b"
    )
    assert (settings.require_state, settings.stop, settings.retriever_timeout_s) == (True, ["</a>"], 5.0)
    assert settings.retriever_urls == ["http://a", "http://b"]


@given(st.one_of(st.text(), st.integers(), st.floats(allow_nan=False), st.lists(st.booleans(), max_size=2)))
def test_only_a_bool_is_a_flag(value):
    with pytest.raises(ValueError, match="weight_trajectories: expected true or false"):
        multi_context(weight_trajectories=value)
