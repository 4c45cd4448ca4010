"""Real trajectories for the record tests: the shipped agent loops (released formats) with a scripted
policy and the real BM25 retriever over the bundled corpus."""

from __future__ import annotations

from memagent_examples.scripted import ScriptedPolicy, agent_texts

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


def script(agent: str, searches: int = 2) -> list[str]:
    """The texts a policy plays: `searches` searches (memsearcher: each followed by its memory rewrite),
    then the answer."""
    return agent_texts(agent, list(QUERIES[:searches]), list(MEMORIES[:searches]), ANSWER, EOS)


def mem1_states(searches: int) -> list[str]:
    """The internal states MEM1's searching turns write."""
    return [f"{('Nothing known yet.', *MEMORIES)[i]} Search next." for i in range(searches)]


async def play(agent: str, texts: list[str], tokenizer, trainer_config, retriever_url: str, **settings):
    """Run the agent loop as verl's worker builds and calls it; returns (outputs as a list, the policy)."""
    from verl_memagent.agent import instantiate_agent_loop, verl_sampling_params, verl_worker_row

    policy = ScriptedPolicy(tokenizer, texts)
    loop = instantiate_agent_loop(
        agent, trainer_config, policy, tokenizer, hf_model_type="qwen2", retriever_urls=retriever_url, **settings
    )
    row = verl_worker_row(QUESTION, {"index": 0}, reward_model={"ground_truth": GOLDEN}, data_source="leda")
    outputs = await loop.run(verl_sampling_params(), **row)
    return (outputs if isinstance(outputs, list) else [outputs]), policy


#: (agent, data source, script) of the trajectories `played_records` plays: two questions' worth of
#: rollouts with different endings, memsearcher's flat contexts and react's growing one
PLAYED = [
    ("memsearcher", "leda", script("memsearcher", searches=2)),
    ("memsearcher", "leda", script("memsearcher", searches=1)),
    ("memsearcher", "leda", ["I will not say.</think> Nothing to do." + EOS]),
    ("react", "leda_react", script("react", searches=2)),
    ("react", "leda_react", script("react", searches=1)),
]


async def played_records(tokenizer, trainer_config, retriever_url: str, step: int = 1):
    """Records of `PLAYED`, rewarded by MemSearcher's reward, as a training step writes them (GRPO groups
    by agent)."""
    from verl_memagent.reward.scores import f1_with_format
    from verl_memagent.trajectories.build import ContextSample, build_record

    records, sessions = [], {}
    for agent, data_source, texts in PLAYED:
        outputs, _ = await play(agent, texts, tokenizer, trainer_config, retriever_url)
        final = outputs[-1].extra_fields
        reward = f1_with_format(data_source, final["final_response"], GOLDEN, extra_info=dict(final))
        session = sessions[agent] = sessions.get(agent, -1) + 1
        uid = f"uid-{agent}"
        contexts = [
            ContextSample(o.prompt_ids, o.response_ids, o.extra_fields, key=f"{uid}_{session}_{i}")
            for i, o in enumerate(outputs)
        ]
        records.append(
            build_record(
                contexts,
                tokenizer,
                source="train",
                step=step,
                data_source=data_source,
                golden_answers=GOLDEN,
                reward=reward["score"],
                reward_info=reward,
                uid=uid,
                session=session,
                row_id=0,
            )
        )
    return records
