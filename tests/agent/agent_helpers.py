"""Helpers of the agent-loop tests: the sampling verl sends, and the check that outputs hold what the model saw."""

import pytest

QUESTION = "What river runs past the town of Leer?"

#: the project's own format and rules (`prompt_style: ours`) with the limits the tests of that format
#: were written for; the released formats are tested in test_released_formats.py
OURS = {
    "memsearcher": {
        "prompt_style": "ours",
        "action_rules": "strict",
        "memory_overflow": "truncate",
        "topk": 5,
        "observation_max_tokens": 1024,
    },
    "mem1": {
        "prompt_style": "ours",
        "memory_overflow": "truncate",
        "require_state": True,
        "tags": {"state": "IS"},
        "max_new_tokens": 512,
        "memory_max_tokens": 1024,
        "observation_max_tokens": 1024,
    },
    "react": {"prompt_style": "ours", "topk": 3, "observation_max_tokens": 1024},
}

#: sampling parameters exactly as verl's AgentLoopWorker builds them for a training rollout


def generated_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of mask-1 positions."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def assert_model_saw_exactly(outputs, calls) -> None:
    """Each generated span is one call's returned ids, and that call's prompt is everything before it.

    `calls` are the backend's records in order ({prompt_ids, token_ids, log_probs}). Masks are 1 on
    exactly the generated tokens and log-probs are the backend's there and 0 elsewhere.
    """
    calls = iter([call for call in calls if call["token_ids"]])  # a call that returned nothing left no span
    for output in outputs:
        runs = generated_runs(output.response_mask)
        assert output.response_ids, "verl places the reward on the last response token: never empty"
        for start, end in runs:
            call = next(calls)
            assert call["prompt_ids"] == output.prompt_ids + output.response_ids[:start]
            assert call["token_ids"] == output.response_ids[start:end]
            assert output.response_logprobs[start:end] == pytest.approx(call["log_probs"])
        masked = [lp for lp, m in zip(output.response_logprobs, output.response_mask, strict=True) if not m]
        assert masked == [0.0] * len(masked)
        assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs)
    assert next(calls, None) is None, "a generate call's tokens are missing from the outputs"
