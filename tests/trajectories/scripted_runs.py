"""Real trajectories for the record tests: the shipped agent loops (released formats) with a scripted
policy and the real BM25 retriever over the bundled corpus."""

from __future__ import annotations

import json

from memagent_examples.scripted import ScriptedPolicy

EOS = "<|im_end|>"
QUESTION = "When was the language spoken from which the settlement on the river Leda opposite Leer takes its name?"
GOLDEN = ["between the 8th and 16th centuries"]
QUERIES = ("Leda river Leer settlement", "Old Frisian language centuries")
MEMORIES = (
    "Leerort lies on the Leda opposite Leer; its name is Old Frisian.",
    "Leerort's name is Old Frisian, spoken between the 8th and 16th centuries.",
)
ANSWER = "between the 8th and 16th centuries"
#: verl's sampling for a training rollout
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


def tool_call(query: str) -> str:
    return json.dumps({"name": "wikipedia_search", "arguments": {"query": query}})


def script(agent: str, searches: int = 2) -> list[str]:
    """The texts a policy plays: `searches` searches (memsearcher: each followed by its memory rewrite),
    then the answer."""
    if agent == "mem1":
        states = [*mem1_states(searches), MEMORIES[searches - 1]]
        turns = [f"<think>{states[i]}</think>\n<search>{QUERIES[i]}</search>" for i in range(searches)]
        return [*turns, f"<think>{states[searches]}</think>\n<answer>{ANSWER}</answer>"]
    texts = []
    for i in range(searches):
        texts.append(f"Look it up.</think>\n<tool_call>{tool_call(QUERIES[i])}</tool_call>{EOS}")
        if agent == "memsearcher":
            texts.append(f"<memory>{MEMORIES[i]}</memory>{EOS}")
    return [*texts, f"It is known now.</think>\n\\boxed{{{ANSWER}}}{EOS}"]


def mem1_states(searches: int) -> list[str]:
    """The internal states MEM1's searching turns write."""
    return [f"{('Nothing known yet.', *MEMORIES)[i]} Search next." for i in range(searches)]


async def play(agent: str, texts: list[str], tokenizer, trainer_config, retriever_url: str, **settings):
    """Run the agent loop as verl's worker builds and calls it; returns (outputs as a list, the policy)."""
    from verl_memagent.agent import instantiate_agent_loop

    policy = ScriptedPolicy(tokenizer, texts)
    loop = instantiate_agent_loop(
        agent, trainer_config, policy, tokenizer, hf_model_type="qwen2", retriever_urls=retriever_url, **settings
    )
    row = {
        "raw_prompt": [{"role": "user", "content": QUESTION}],
        "extra_info": {"question": QUESTION, "index": 0},
        "reward_model": {"ground_truth": GOLDEN},
        "data_source": "leda",
    }
    outputs = await loop.run(dict(SAMPLING), **row)
    return (outputs if isinstance(outputs, list) else [outputs]), policy
