"""ScriptedPolicy stops where a server would: first EOS id, max_tokens, or the first decoded stop string."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent_examples.scripted import ScriptedPolicy

PIECES = ["<search>", "</search>", "</tool_call>", "<|im_end|>", "Leda", " river", "\n", "é", "中文", "</", "a"]
STOPS = ["</search>", "</tool_call>", "</memory>", "a </", "é"]


def emitted(tokenizer, text: str, stops: list[str], max_tokens: int) -> list[int]:
    policy = ScriptedPolicy(tokenizer, [text])
    params = {"stop": stops, "max_tokens": max_tokens, "logprobs": True}
    output = asyncio.run(policy.generate("r", prompt_ids=[1], sampling_params=params))
    assert output.log_probs == policy.calls[0]["log_probs"] and len(output.log_probs) == len(output.token_ids)
    return output.token_ids


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), max_size=30),
    stops=st.lists(st.sampled_from(STOPS), max_size=3, unique=True),
    max_tokens=st.integers(1, 80),
)
def test_stops_at_the_first_point_a_server_would(tokenizer, pieces, stops, max_tokens):
    text = "".join(pieces)
    ids = tokenizer.encode(text, add_special_tokens=False)
    got = emitted(tokenizer, text, stops, max_tokens)

    def ends_at(k: int) -> bool:
        decoded = tokenizer.decode(ids[:k])
        return ids[k - 1] == tokenizer.eos_token_id or k == max_tokens or any(s in decoded for s in stops)

    assert got == ids[: len(got)]
    assert not any(ends_at(k) for k in range(1, len(got)))
    assert len(got) == len(ids) or ends_at(len(got))


def test_script_exhausted_is_an_error(tokenizer):
    with pytest.raises(RuntimeError, match="the script has 0 texts"):
        asyncio.run(ScriptedPolicy(tokenizer, []).generate("r", prompt_ids=[1], sampling_params={}))


def test_a_hold_keeps_every_call_after_the_first_waiting_while_its_file_exists(tokenizer, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    policy = ScriptedPolicy(tokenizer, ["first", "second"], hold=hold)

    async def play() -> None:
        await policy.generate("r", prompt_ids=[1], sampling_params={})  # the first call is never held
        second = asyncio.ensure_future(policy.generate("r", prompt_ids=[1], sampling_params={}))
        await asyncio.sleep(1.0)
        assert not second.done() and len(policy.calls) == 1
        hold.unlink()
        assert (await second).token_ids == tokenizer.encode("second", add_special_tokens=False)

    asyncio.run(play())
