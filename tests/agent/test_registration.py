"""The agents as verl finds them: registry names after `import verl`, the shipped agent-loop YAML, overrides."""

import asyncio

import hydra
import pytest
from omegaconf import OmegaConf

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import AGENT_LOOPS_YAML
from verl_memagent.agent.settings import PromptStyle

AGENTS = ("memsearcher", "mem1", "react")


async def build_as_verls_worker(entry, trainer_config, tokenizer):
    """The loop of an agent-loop entry, built with the call and arguments of verl's AgentLoopWorker."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    return hydra.utils.instantiate(
        config=entry,
        trainer_config=DictConfigWrap(config=trainer_config),
        server_manager=ScriptedPolicy(tokenizer, []),
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen2",
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(trainer_config.data),
        tools=ToolListWrap([]),
    )


def test_import_verl_registers_the_three_agents():
    import verl  # noqa: F401  (loads the plugin through the verl.plugins entry point)
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert _agent_loop_registry["memsearcher"]["_target_"].endswith("MemSearcherAgentLoop")
    assert _agent_loop_registry["mem1"]["_target_"].endswith("Mem1AgentLoop")
    assert _agent_loop_registry["react"]["_target_"].endswith("ReactAgentLoop")


def test_shipped_yaml_is_what_verls_worker_loads(monkeypatch, trainer_config, tokenizer):
    from verl.utils.import_utils import resolve_config_path

    monkeypatch.setenv("MEMAGENT_RETRIEVER_URL", "http://127.0.0.1:9/,http://127.0.0.1:10/")
    entries = OmegaConf.load(resolve_config_path(str(AGENT_LOOPS_YAML)))
    assert [e.name for e in entries] == ["memsearcher", "mem1", "react"]

    for entry in entries:
        loop = asyncio.run(build_as_verls_worker(entry, trainer_config, tokenizer))
        assert loop.settings.retriever_urls == ["http://127.0.0.1:9/", "http://127.0.0.1:10/"]
        assert loop.context_cap == 4096 + 2048  # verl's rollout prompt_length + response_length
    assert loop.settings.max_turns == 5 and loop.settings.topk == 10  # react: MemSearcher's released values


async def test_tags_and_prompts_are_configurable(run_agent, tokenizer):
    policy = ScriptedPolicy(tokenizer, ["<state>s</state><ask>Leer</ask>", "<state>t</state><final>Leda</final>"])
    outputs = await run_agent(
        "mem1",
        policy,
        tags={"state": "state", "search": "ask", "answer": "final"},
        prompts={"user": "Q: {{ question }} (state in <{{ tags.state }}>)"},
    )
    assert outputs[-1].extra_fields["finish_reason"] == "answer"
    assert policy.calls[0]["sampling_params"]["stop"] == ["</ask>", "</final>"]
    assert "(state in <state>)" in tokenizer.decode(outputs[0].prompt_ids)


async def test_bad_settings_fail_at_construction(run_agent, tokenizer):
    with pytest.raises(Exception, match="memory_overflow"):
        await run_agent("memsearcher", ScriptedPolicy(tokenizer, []), memory_overflow="drop")
    with pytest.raises(Exception, match="topk"):
        await run_agent("react", ScriptedPolicy(tokenizer, []), topk=0)
    with pytest.raises(Exception, match="observation_max_tokens: expected a positive integer or null"):
        await run_agent("mem1", ScriptedPolicy(tokenizer, []), observation_max_tokens=0)
    with pytest.raises(Exception, match="prompts.user: .*questoin"):
        await run_agent("react", ScriptedPolicy(tokenizer, []), prompts={"user": "{{ questoin }}"})


def test_a_loop_built_from_its_registry_name_has_its_papers_settings(trainer_config, tokenizer):
    """verl's registry carries the shipped YAML's entries, so no agent falls back to another's values;
    the dataclass defaults are MemSearcher's released settings."""
    import verl  # noqa: F401
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from verl_memagent.agent.settings import AgentSettings

    yaml = {entry.name: entry for entry in OmegaConf.load(AGENT_LOOPS_YAML)}

    for name, entry in yaml.items():
        settings = asyncio.run(build_as_verls_worker(_agent_loop_registry[name], trainer_config, tokenizer)).settings
        for key, value in entry.items():
            if key not in ("name", "_target_", "retriever_urls"):
                assert getattr(settings, key) == value, (name, key)
    defaults = AgentSettings()
    for key, value in yaml["memsearcher"].items():
        if key not in ("name", "_target_", "retriever_urls"):
            assert getattr(defaults, key) == value, key


def test_a_name_taken_by_another_loop_is_refused_naming_both():
    """verl's `register` decorator overwrites silently; ours refuses, as verl's estimator registry does,
    and writing our own entries again changes nothing."""
    from types import SimpleNamespace

    from verl_memagent.agent.register import _register, agent_loop_entries

    ours = SimpleNamespace(_agent_loop_registry={})
    _register(ours)
    _register(ours)  # the same entries again: no conflict
    assert ours._agent_loop_registry == agent_loop_entries()

    other = SimpleNamespace(_agent_loop_registry={"react": {"_target_": "other_plugin.ReactLoop"}})
    with pytest.raises(ValueError, match=r"names are taken \('react' by other_plugin\.ReactLoop\)"):
        _register(other)
    assert other._agent_loop_registry == {"react": {"_target_": "other_plugin.ReactLoop"}}


@pytest.mark.parametrize("style", [style.value for style in PromptStyle])
def test_every_agent_declares_its_turn_format_for_every_prompt_style(style, trainer_config, tokenizer):
    """One declaration per agent and style: the stop strings it sends and whether it reads tool calls."""
    from verl_memagent.agent import instantiate_agent_loop

    loops = {name: instantiate_agent_loop(name, trainer_config, None, tokenizer, prompt_style=style) for name in AGENTS}
    released = style != "ours"
    assert {name: loop.stop for name, loop in loops.items()} == {
        "memsearcher": [] if released else ["</tool_call>", "</memory>"],
        "mem1": ["</search>", "</answer>"],
        "react": [] if released else ["</search>", "</answer>"],
    }
    assert {name: loop.turn_format.tool_calls for name, loop in loops.items()} == {
        "memsearcher": True,
        "mem1": False,
        "react": released,
    }
