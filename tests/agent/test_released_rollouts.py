"""MemSearcher's rollout decisions, token for token against the released training rollout.

fixtures/released_rollouts.json holds what the released `vLLMRolloutWithTool.generate_sequences` did
with scripted model outputs (malformed and multiple tool calls, turns cut by the token limit, memory
rewrites; generator and commit in the file's `source`): every training row (prompt ids, response ids,
loss mask) and which row ended the trajectory, and the result text of every tool call. Our loop, with
its default settings (`action_rules: released`), the same outputs and the same retriever, must emit
the same rows, end at the same one and show the model the same tool results.
"""

import json
from pathlib import Path

import pytest
from agent_helpers import QUESTION

from memagent_examples.scripted import ScriptedPolicy

RELEASED = json.loads((Path(__file__).parent / "fixtures" / "released_rollouts.json").read_text())
EOS = "<|im_end|>"
TOPK = 2  # the scripted calls ask the released retriever for top_n 2; ours takes `topk`


def script(outputs: list[dict]) -> list[str]:
    """The texts a scripted policy plays: an ended output ends with the end-of-turn token."""
    return [output["text"] + (EOS if output["ended"] else "") for output in outputs]


def ids(text: str) -> list[int]:
    return [int(token) for token in text.split()]


@pytest.mark.parametrize("case", RELEASED["rollouts"], ids=lambda case: case["name"])
async def test_rollout_decisions_are_the_released_ones(run_released, qwen_tokenizer, case):
    policy = ScriptedPolicy(qwen_tokenizer, script(case["outputs"]))
    outputs = await run_released("memsearcher", policy, QUESTION, topk=TOPK, max_turns=case["max_turns"])
    rows = case["rows"]
    assert len(policy.calls) == len(case["outputs"]), "the trajectory went on or ended where the released one did not"
    assert [row["final"] for row in rows] == [False] * (len(rows) - 1) + [True]
    assert len(outputs) == len(rows)
    for output, row in zip(outputs, rows, strict=True):
        assert output.prompt_ids == ids(row["prompt_ids"])  # the next context
        assert qwen_tokenizer.decode(output.response_ids, skip_special_tokens=False) == row["response"]
        assert output.response_ids == ids(row["response_ids"])
        assert output.response_mask == [int(m) for m in row["loss_mask"]]
    response = "".join(qwen_tokenizer.decode(o.response_ids, skip_special_tokens=False) for o in outputs)
    for results in case["tool_results"]:
        for result in results:
            assert f"\n{result}\n</tool_response>" in response


def test_the_fixtures_cover_every_kind_the_issue_names():
    names = {case["name"] for case in RELEASED["rollouts"]}
    assert {"bad_json", "unknown_tool", "empty_query", "call_and_box", "two_calls"} <= names
    assert {"Parse tool call failed", "invalid query", "Parse query failed", "error: 400", "error: 422"} <= {
        result for case in RELEASED["rollouts"] for results in case["tool_results"] for result in results
    }
