"""verl's own reward path (AgentLoopWorker._compute_score -> RewardLoopWorker -> our function) on our outputs."""

import types

import pytest
from omegaconf import OmegaConf

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import verl_worker_row

SEARCH = '<think>t</think><tool_call>{"name": "wikipedia_search", "arguments": {"query": "Leda river"}}</tool_call>'
MEMORY = "<memory>Leer lies on the river Leda.</memory>"
ANSWER = "<think>from memory</think>\\boxed{Leda}<|im_end|>"
TWO_BLOCKS = "<reason>a</reason><reason>b</reason>\\boxed{Leda}"


@pytest.fixture(scope="module")
def reward_config(tiny_model_dir):
    from verl_memagent.agent import verl_trainer_config

    config = verl_trainer_config()
    OmegaConf.update(config, "actor_rollout_ref.model.path", str(tiny_model_dir))
    OmegaConf.update(config, "reward.custom_reward_function.path", "pkg://verl_memagent.reward.scores")
    return config


async def score_with_verl(config, tokenizer, outputs, function_name, ground_truth):
    """Run verl's agent-loop scoring of one trajectory, as its worker does, with a real RewardLoopWorker."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    OmegaConf.update(config, "reward.custom_reward_function.name", function_name)
    reward_worker = RewardLoopWorker(config)
    handle = types.SimpleNamespace(compute_score=types.SimpleNamespace(remote=reward_worker.compute_score))
    worker = AgentLoopWorker.__new__(AgentLoopWorker)  # only the scoring step, no Ray actor or servers
    worker.reward_loop_worker_handles, worker.processor, worker.mm_processor_kwargs = [handle], None, {}
    row = {
        "data_source": "hotpotqa",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        **verl_worker_row("q"),
    }
    await worker._compute_score(outputs, kwargs=row)
    return outputs[-1]


async def test_memsearcher_list_scored_on_its_final_output(run_ours, tokenizer, reward_config):
    outputs = await run_ours("memsearcher", ScriptedPolicy(tokenizer, [SEARCH, MEMORY, ANSWER]), topk=5)
    assert len(outputs[0].response_ids) + len(outputs[0].prompt_ids) > len(outputs[1].response_ids)
    final = await score_with_verl(reward_config, tokenizer, outputs, "f1_with_format", ["Leda"])
    assert final.reward_score == 1.0 and final.extra_fields["reward_extra_info"]["format_ok"] == 1.0


@pytest.mark.parametrize(("golds", "score"), [([["Leda"]], 1.0), ([["Lower Saxony"], ["Leda"]], 0.1)])
async def test_memsearcher_multi_objective_with_format_term_scored_by_verl(
    run_ours, tokenizer, reward_config, golds, score
):
    outputs = await run_ours("memsearcher", ScriptedPolicy(tokenizer, [SEARCH, MEMORY, ANSWER]), topk=5)
    final = await score_with_verl(reward_config, tokenizer, outputs, "multi_objective_em_with_format", golds)
    # one answer for two objectives misses the first: no hit, a valid format, the format term
    assert final.reward_score == pytest.approx(score)
    assert final.extra_fields["reward_extra_info"]["em_fraction"] == (1.0 if score == 1.0 else 0.0)


async def test_mem1_multi_objective_scored_by_verl(run_ours, tokenizer, reward_config):
    script = [
        "<IS>s</IS><search>Leer</search>",
        "<IS>Leer, Lower Saxony, on the Leda.</IS><answer>Lower Saxony; Leda</answer>",
    ]
    outputs = await run_ours("mem1", ScriptedPolicy(tokenizer, script), topk=5)
    final = await score_with_verl(reward_config, tokenizer, outputs, "multi_objective_em", [["Lower Saxony"], ["Leda"]])
    assert final.reward_score == 2.0


async def test_react_single_output_scored_by_verl(run_ours, tokenizer, reward_config):
    output = await run_ours("react", ScriptedPolicy(tokenizer, ["<search>Leer</search>", "<answer>Leda</answer>"]))
    final = await score_with_verl(reward_config, tokenizer, [output], "exact_match_score", ["Leda"])
    assert final.reward_score == 1.0


async def test_renamed_tags_are_scored_as_the_agent_parsed_them(run_agent, tokenizer, reward_config):
    tags = {"state": "state", "search": "ask", "answer": "final"}
    script = ["<state>s</state><ask>Leer</ask>", "<state>t</state><final>Lower Saxony; Leda</final>"]
    outputs = await run_agent("mem1", ScriptedPolicy(tokenizer, script), tags=tags, topk=5)
    assert outputs[-1].extra_fields["final_answer"] == "Lower Saxony; Leda"
    final = await score_with_verl(reward_config, tokenizer, outputs, "multi_objective_em", [["Lower Saxony"], ["Leda"]])
    assert final.reward_score == 2.0  # the default grammar would find no <answer> here and score 0


@pytest.mark.parametrize(
    ("rules", "answer", "score"),
    [
        ("released", "<reason>r</reason>\\boxed{Leda}", 1.0),
        ("released", "<reason>a</reason><reason>b\\boxed{Leda}", 0.0),  # unpaired reasoning tags
        ("strict", "<reason>r</reason>\\boxed{Leda}", 1.0),
        ("strict", TWO_BLOCKS, 0.0),  # two blocks: the strict rule's, released accepts them
    ],
)
async def test_memsearcher_format_rule_follows_renamed_tags(run_agent, tokenizer, reward_config, rules, answer, score):
    search = '<reason>t</reason><call>{"name": "wikipedia_search", "arguments": {"query": "Leda river"}}</call>'
    policy = ScriptedPolicy(tokenizer, [search, MEMORY, answer + "<|im_end|>"])
    tags = {"think": "reason", "tool_call": "call"}
    outputs = await run_agent("memsearcher", policy, tags=tags, topk=5, action_rules=rules)
    assert len(outputs) == 2 and outputs[-1].extra_fields["finish_reason"] in ("answer", "bad_format")
    final = await score_with_verl(reward_config, tokenizer, outputs, "f1_with_format", ["Leda"])
    # the default tags (<think>) would not see these blocks: the agent's record decides
    assert final.reward_score == score and final.extra_fields["reward_extra_info"]["format_ok"] == score
