"""The released prompt styles, token for token against contexts the papers' released code rendered.

fixtures/released_contexts.json holds what MemSearcher's and MEM1's released code built for one
question each (source commits and generator in the file's `source`); fixtures/qwen2.5_chat_template.jinja
is Qwen2.5's chat template, which the released checkpoints use. Our loops run on the tiny tokenizer
with that template, the real BM25 retriever and a scripted policy; every prompt a generate call
receives must be the released rendering's ids: its text pieces encoded one by one as the released
training code did (`released_train`), or its whole text as the released inference servers did
(`released_eval`).
"""

import json
from pathlib import Path

import pytest
from agent_helpers import QUESTION

from memagent_examples.scripted import ScriptedPolicy

FIXTURES = Path(__file__).parent / "fixtures"
RELEASED = json.loads((FIXTURES / "released_contexts.json").read_text())
EOS = "<|im_end|>"
STYLES = ("released_train", "released_eval")


def expected_ids(tokenizer, style: str, pieces: list[str], text: str) -> list[int]:
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    return [t for piece in pieces for t in encode(piece)] if style == "released_train" else encode(text)


@pytest.mark.parametrize("style", STYLES)
async def test_memsearcher_contexts_are_the_released_ones(run_released, qwen_tokenizer, style):
    from verl_memagent.reward.scores import f1_with_format

    released = RELEASED["memsearcher"]
    inputs = released["inputs"]
    answer = " The memory says it. </think> \\boxed{Leda}" + EOS
    policy = ScriptedPolicy(qwen_tokenizer, [inputs["action"] + EOS, inputs["memory_output"] + EOS, answer])
    outputs = await run_released("memsearcher", policy, inputs["question"], prompt_style=style, topk=inputs["topk"])
    assert outputs[-1].extra_fields["finish_reason"] == "answer" and len(policy.calls) == 3
    # the reward sees the final turn opened by the prompt's <think>, as the released reward did
    final = dict(outputs[-1].extra_fields)
    assert f1_with_format("t", "", ["Leda"], final)["score"] == 1.0
    decode = lambda ids: qwen_tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731

    for call, turn in ((policy.calls[0], 0), (policy.calls[2], 1)):
        pieces, text = released["train_turn_prompt_pieces"][turn], released["eval_turn_prompts"][turn]
        assert decode(call["prompt_ids"]) == text
        assert call["prompt_ids"] == expected_ids(qwen_tokenizer, style, pieces, text)
    assert expected_ids(qwen_tokenizer, "released_train", *[released["train_turn_prompt_pieces"][0]], "") != (
        expected_ids(qwen_tokenizer, "released_eval", [], released["eval_turn_prompts"][0])
    ), "the two styles must differ somewhere for this test to tell them apart"

    # the memory rewrite's context: action as sampled, then the tool response and instruction in one
    # user turn and the assistant's opening, inserted as the released training code encoded them
    memory_prompt = policy.calls[1]["prompt_ids"]
    assert decode(memory_prompt) == released["memory_step_prompt"]
    inserted = released["memory_step_prompt"].split(inputs["action"] + EOS, 1)[1]
    tool_turn, opening = inserted.rsplit("\n<|im_start|>assistant\n", 1)[0], "\n<|im_start|>assistant\n"
    sampled = policy.calls[0]["token_ids"]
    encode = lambda s: qwen_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    assert memory_prompt == policy.calls[0]["prompt_ids"] + sampled + encode(tool_turn) + encode(opening)


@pytest.mark.parametrize("style", STYLES)
async def test_mem1_contexts_are_the_released_ones(run_released, qwen_tokenizer, style):
    from verl_memagent.data.compose import TASK_PREFIX

    released = RELEASED["mem1"]
    inputs = released["inputs"]
    question = TASK_PREFIX + "; ".join(q.rstrip("?") + "?" for q in inputs["questions"])  # as `prepare` composes
    policy = ScriptedPolicy(qwen_tokenizer, inputs["responses"])
    outputs = await run_released("mem1", policy, question, prompt_style=style)
    assert outputs[-1].extra_fields["finish_reason"] == "answer" and len(policy.calls) == 3
    for turn, call in enumerate(policy.calls):
        pieces, text = released["train_turn_prompt_pieces"][turn], released["eval_turn_prompts"][turn]
        if style == "released_train":
            text = "".join(pieces)
        assert qwen_tokenizer.decode(call["prompt_ids"], skip_special_tokens=False) == text
        assert call["prompt_ids"] == expected_ids(qwen_tokenizer, style, pieces, text)
        assert call["sampling_params"]["stop"] == ["</search>", "</answer>"]
    # training: the sample's response is what was sampled, even where the next prompt kept only a part
    assert outputs[0].response_ids == policy.calls[0]["token_ids"]


async def test_mem1_released_rollout_checks_no_format(run_released, qwen_tokenizer):
    """generation_think.py:502-512 returns True before any check: a turn without a state goes on."""
    script = ["<search>Leer town</search>", "<think>Known.</think><answer>Leda</answer>"]
    outputs = await run_released("mem1", ScriptedPolicy(qwen_tokenizer, script), QUESTION)
    assert outputs[-1].extra_fields["finish_reason"] == "answer"
    ruled = await run_released("mem1", ScriptedPolicy(qwen_tokenizer, script), QUESTION, require_state=True)
    assert ruled[-1].extra_fields["finish_reason"] == "no_state"


MS_SEARCH = ' t </think><tool_call>{"name": "wikipedia_search", "arguments": {"query": "Leda"}}</tool_call>' + EOS


@pytest.mark.parametrize(
    ("mode", "reason", "penalised"),
    [("end", "memory_overflow", False), ("penalty", "memory_overflow", True), ("truncate", "answer", False)],
)
async def test_memory_rewrite_cut_by_the_token_limit(run_released, qwen_tokenizer, mode, reason, penalised):
    """vllm_rollout_spmd.py:716-733: a rewrite that ends by length is not re-activated (`end`)."""
    rambling = "<memory>" + " ".join(f"w{i}" for i in range(80))
    answer = " t </think> \\boxed{Leda}" + EOS
    policy = ScriptedPolicy(qwen_tokenizer, [MS_SEARCH, rambling, answer])
    outputs = await run_released("memsearcher", policy, QUESTION, topk=1, max_new_tokens=48, memory_overflow=mode)
    final = outputs[-1].extra_fields
    assert (final["finish_reason"], final["penalised"]) == (reason, penalised)
    assert len(outputs) == (2 if mode == "truncate" else 1)


async def test_react_is_memsearchers_format_with_the_whole_history(run_released, qwen_tokenizer):
    """react differs from memsearcher only in its context: same tool call, documents, answer and reward."""
    from verl_memagent.reward.scores import f1_with_format

    answer = " It is the Leda. </think> \\boxed{Leda}" + EOS
    policy = ScriptedPolicy(qwen_tokenizer, [MS_SEARCH, MS_SEARCH, answer])
    output = await run_released("react", policy, QUESTION, topk=1)
    assert output.extra_fields["finish_reason"] == "answer" and output.extra_fields["searches"] == 2
    prompt = qwen_tokenizer.decode(output.prompt_ids, skip_special_tokens=False)
    assert output.prompt_ids == qwen_tokenizer.encode(prompt, add_special_tokens=False)  # the text, encoded whole
    assert '"name": "wikipedia_search"' in prompt and prompt.endswith(
        f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n<think>"
    )
    response = qwen_tokenizer.decode(output.response_ids, skip_special_tokens=False)
    tool_turn = '<|im_start|>user\n<tool_response>{"name": "wikipedia_search", "arguments": {"query": "Leda"}}\n"'
    assert response.count(tool_turn) == 2 and response.count("<|im_start|>assistant\n<think>") == 2
    assert response.endswith(answer)
    # the released reward (re_call.py:97-184) judges the last assistant turn, as for memsearcher
    last_turn = response.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix(EOS)
    assert output.extra_fields["final_response"] == last_turn
    assert f1_with_format("t", "", ["Leda"], dict(output.extra_fields))["score"] == 1.0


async def released_documents_of(retriever_url, agent: str, query: str, topk: int) -> str:
    from verl_memagent.agent import mem1, tool_calls
    from verl_memagent.search import RetrieverClient

    documents = (await RetrieverClient(retriever_url).search([query], topk))[0]
    return (mem1 if agent == "mem1" else tool_calls).released_documents(documents)


@pytest.mark.parametrize("agent", ["memsearcher", "react"])
async def test_memsearcher_and_react_documents_are_uncut_by_default(run_released, qwen_tokenizer, retriever_url, agent):
    """The released code caps no tool response: the default (`observation_max_tokens: null`) passes all
    ten passages; a cap, when set, cuts the documents to that many tokens."""
    encode = lambda s: qwen_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    documents = await released_documents_of(retriever_url, agent, "Leda", 10)
    assert len(encode(documents)) > 200
    capped = qwen_tokenizer.decode(encode(documents)[:40])
    for cap, expected in ((None, documents), (40, capped)):
        script = [MS_SEARCH, "<memory> Leda. </memory>" + EOS, "t </think> \\boxed{Leda}"]
        policy = ScriptedPolicy(qwen_tokenizer, script)
        settings = {} if cap is None else {"observation_max_tokens": cap}
        await run_released(agent, policy, QUESTION, **settings)
        seen = qwen_tokenizer.decode(policy.calls[1]["prompt_ids"], skip_special_tokens=False)
        assert f"}}\n{expected}\n</tool_response>" in seen


async def test_mem1_released_train_cuts_the_whole_observation(run_released, qwen_tokenizer, retriever_url):
    """generation_think.py:89-98 cuts the tokenised observation (tags and hint included) at
    max_obs_length; `released_eval` and `ours` cut the documents only."""
    script = ["<think>Nothing yet.</think>\n<search>Leer town</search>", "<think>Known.</think><answer>Leda</answer>"]
    encode = lambda s: qwen_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    full = ScriptedPolicy(qwen_tokenizer, script)
    await run_released("mem1", full, QUESTION)
    capped = ScriptedPolicy(qwen_tokenizer, script)
    await run_released("mem1", capped, QUESTION, observation_max_tokens=30)

    kept = full.calls[0]["prompt_ids"] + full.calls[0]["token_ids"]
    observation = full.calls[1]["prompt_ids"][len(kept) :]
    assert len(observation) > 30 and encode(qwen_tokenizer.decode(observation)) == observation
    assert capped.calls[1]["prompt_ids"] == kept + observation[:30]
    assert "</information>" not in qwen_tokenizer.decode(capped.calls[1]["prompt_ids"])

    documents = await released_documents_of(retriever_url, "mem1", "Leer town", 3)
    eval_capped = ScriptedPolicy(qwen_tokenizer, script)
    await run_released("mem1", eval_capped, QUESTION, observation_max_tokens=30, prompt_style="released_eval")
    seen = qwen_tokenizer.decode(eval_capped.calls[1]["prompt_ids"])
    assert len(encode(documents)) > 30 and documents not in seen
    assert qwen_tokenizer.decode(encode(documents)[:30]) + "\n</information>" in seen


@pytest.mark.parametrize("cut", [True, False])
async def test_mem1_long_history_cut_as_released_is_an_option(run_released, qwen_tokenizer, cut):
    """generation_think.py:122-130 cuts the rolling history at max_prompt_length (4096) and tensor_helper.py:
    39-48 then keeps its first prompt-length tokens, mid-history once it is longer: `released_history_cut`
    renders those prompts id for id; the default keeps the question (the method's context)."""
    from verl_memagent.data.compose import TASK_PREFIX

    released = RELEASED["mem1"]
    long = released["long_trajectory"]
    question = TASK_PREFIX + "; ".join(q.rstrip("?") + "?" for q in released["inputs"]["questions"])
    policy = ScriptedPolicy(qwen_tokenizer, long["inputs"]["responses"])
    outputs = await run_released("mem1", policy, question, released_history_cut=cut)
    assert outputs[-1].extra_fields["finish_reason"] == "answer" and len(policy.calls) == 6
    released_prompts = [[int(token) for token in ids.split()] for ids in long["train_turn_prompt_ids"]]
    question_ids = released_prompts[0]
    assert long["history_tokens"][2] <= 4096 < long["history_tokens"][3]  # the fixture crosses the cap at turn 4
    assert long["question_kept"] == [True, True, True, False, False, False]
    for call, released_ids in zip(policy.calls, released_prompts, strict=True):
        if cut:
            assert call["prompt_ids"] == released_ids
        else:
            assert call["prompt_ids"][: len(question_ids)] == question_ids
    if not cut:  # from turn 4 on the released prompts lost the question; ours are question + last turn
        assert policy.calls[3]["prompt_ids"] != released_prompts[3]
