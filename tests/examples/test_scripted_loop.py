"""`ScriptedAgentLoop`, built from an agent-loop entry as verl's worker builds one, plays several-turn
trajectories through the real agent loops and retriever whose rewards differ within a group."""

from __future__ import annotations

import hydra
import pytest
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

from verl_memagent.agent import verl_sampling_params, verl_trainer_config, verl_worker_row
from verl_memagent.reward.scores import f1_with_format, multi_objective_em

ROW = verl_worker_row(
    "Which river runs past Leer?", {"index": 0}, reward_model={"ground_truth": ["Leda"]}, data_source="leda"
)
TASK = verl_worker_row(
    "Which river runs past Leer; which sea does it reach?",
    {"index": 0},
    reward_model={"ground_truth": [["Leda"], ["North Sea"]]},
    data_source="leda",
)


def scripted(agent: str, tokenizer, retriever_url: str):
    entry = OmegaConf.create(
        {"name": agent, "_target_": "memagent_examples.scripted.ScriptedAgentLoop", "agent": agent, "topk": 1}
    )
    config = verl_trainer_config(prompt_length=4096, response_length=4096)
    return hydra.utils.instantiate(  # what verl's AgentLoopWorker hands every loop
        config=entry,
        trainer_config=DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
        retriever_urls=retriever_url,
    )


@pytest.mark.parametrize("agent", ["memsearcher", "react"])
async def test_sessions_play_two_one_and_no_searches_and_earn_different_rewards(agent, tokenizer, retriever_url):
    rewards, contexts = [], []
    for session in range(3):
        outputs = await scripted(agent, tokenizer, retriever_url).run(verl_sampling_params(), session_id=session, **ROW)
        outputs = outputs if isinstance(outputs, list) else [outputs]
        final = outputs[-1].extra_fields
        contexts.append(len(outputs))
        rewards.append(f1_with_format("leda", final["final_response"], ["Leda"], extra_info=dict(final))["score"])
    # memsearcher: one context per search and one for the answer; react: one growing context
    assert contexts == ([3, 2, 1] if agent == "memsearcher" else [1, 1, 1])
    assert rewards == [1.0, 0.1, 1.0]  # right, wrong but well-formed, right


async def test_mem1_answers_some_objectives_right(tokenizer, retriever_url):
    scores = []
    for session in range(3):
        outputs = await scripted("mem1", tokenizer, retriever_url).run(
            verl_sampling_params(), session_id=session, **TASK
        )
        final = outputs[-1].extra_fields
        golds = TASK["reward_model"]["ground_truth"]
        scores.append(multi_objective_em("leda", final["final_response"], golds, extra_info=dict(final))["score"])
    assert scores == [2.0, 1.0, 2.0]


@pytest.mark.parametrize(("step", "version"), [(1, 0), (3, 2)])
async def test_a_row_reports_the_weights_of_the_step_before_its_own(step, version, tokenizer, retriever_url):
    """What a real server reports: the weights verl loaded at the end of step - 1 (0: the initial ones), so
    that verl's staleness of the row, (step - 1) - max_global_steps, reads 0, not -1."""
    outputs = await scripted("memsearcher", tokenizer, retriever_url).run(
        verl_sampling_params(), session_id=0, global_steps=step, **ROW
    )
    assert len(outputs) == 3  # two searches and the answer: every context's calls report it
    for output in outputs:
        fields = output.extra_fields
        assert (fields["min_global_steps"], fields["max_global_steps"]) == (version, version)


async def test_a_row_without_a_step_reports_no_version(tokenizer, retriever_url):
    outputs = await scripted("memsearcher", tokenizer, retriever_url).run(verl_sampling_params(), session_id=0, **ROW)
    assert all("max_global_steps" not in output.extra_fields for output in outputs)
