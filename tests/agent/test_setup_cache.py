"""Per-sample setup: what is the same for every sample is built once per process, and only that is shared."""

import jinja2
from omegaconf import OmegaConf

from memagent_examples.scripted import ScriptedPolicy
from verl_memagent.agent import instantiate_agent_loop
from verl_memagent.agent.rendering import _shared_turn_close_ids
from verl_memagent.agent.settings import ByValue


def build(trainer_config, tokenizer, name="memsearcher", **settings):
    policy = ScriptedPolicy(tokenizer, [])
    return instantiate_agent_loop(name, trainer_config, policy, tokenizer, "qwen2", **settings)


def test_prompts_are_parsed_once_per_process(monkeypatch, trainer_config, tokenizer):
    compiled: list[str] = []
    from_string = jinja2.Environment.from_string

    def counting_from_string(env, source, *args, **kwargs):
        compiled.append(source)
        return from_string(env, source, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "from_string", counting_from_string)
    settings = {"max_new_tokens": 509, "prompts": {"user": "Q: {{ question }} M: {{ memory }}"}}  # unseen so far
    loops = [build(trainer_config, tokenizer, **settings) for _ in range(30)]

    templates = loops[0].settings.prompts
    assert sorted(source for source in compiled if source in templates.values()) == sorted(templates.values())
    assert all(loop.prompts is loops[0].prompts and loop.settings is loops[0].settings for loop in loops)
    assert loops[0].prompts.render("user", question="q", memory="m") == "Q: q M: m"


def test_turn_close_tokens_are_rendered_once_per_tokenizer(trainer_config, tokenizer):
    build(trainer_config, tokenizer, "react")
    misses = _shared_turn_close_ids.cache_info().misses
    loops = [build(trainer_config, tokenizer, name) for name in ("memsearcher", "mem1", "react") * 10]
    assert _shared_turn_close_ids.cache_info().misses == misses
    assert loops[0].turn_close_ids == tokenizer.encode("<|im_end|>", add_special_tokens=False)


def test_loops_with_different_settings_share_nothing_of_it(trainer_config, tokenizer):
    plain = build(trainer_config, tokenizer, "mem1")
    renamed = build(trainer_config, tokenizer, "mem1", tags={"search": "ask"}, prompts={"user": "Q: {{ question }}"})
    assert renamed.prompts is not plain.prompts
    assert renamed.stop == ["</ask>", "</answer>"] and plain.stop == ["</search>", "</answer>"]
    assert renamed.prompts.render("user", question="q") == "Q: q"
    assert "Q: q" not in plain.prompts.render("user", question="q")
    assert build(trainer_config, tokenizer, "mem1", max_turns=2).settings.max_turns == 2
    assert plain.settings.max_turns != 2


def test_settings_are_keyed_by_their_value():
    assert len({ByValue({"topk": 1}), ByValue({"topk": True}), ByValue({"topk": 1.0})}) == 3
    assert ByValue({"stop": ["</a>"]}) != ByValue({"stop": "</a>"})
    assert ByValue(OmegaConf.create({"tags": {"a": "b"}, "topk": 2})) == ByValue({"topk": 2, "tags": {"a": "b"}})
    assert hash(ByValue({"b": [1, 2], "a": None})) == hash(ByValue({"a": None, "b": [1, 2]}))


def test_released_prompt_is_rendered_once_per_process(trainer_config, tokenizer):
    loops = [build(trainer_config, tokenizer, "memsearcher", max_new_tokens=507) for _ in range(3)]
    assert all(loop.released_prompt_pieces is loops[0].released_prompt_pieces for loop in loops)
    other = build(trainer_config, tokenizer, "memsearcher", max_new_tokens=507, prompts={"system": "Other system."})
    assert "Other system." in "".join(other.released_prompt_pieces)
    assert "Other system." not in "".join(loops[0].released_prompt_pieces)
