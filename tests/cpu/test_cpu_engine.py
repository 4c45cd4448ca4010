"""The CPU engine's response-only head computes what verl's engine computes, to float32 resolution.

Both engines' own `prepare_model_inputs` / `prepare_model_outputs` run on a real tiny Qwen2 and on
micro-batches laid out as verl's trainer hands them over (nested prompts, responses and input ids);
compared are the response log-probabilities and entropies (read with verl's `no_padding_2_padding`,
as its losses read them) and the gradients of a loss over both.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from transformers import AutoModelForCausalLM
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.utils.seqlen_balancing import restore_dynamic_batch
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.utils.padding import no_padding_2_padding

from verl_memagent.cpu.engine import CPUEngineWithLMHead, length_order, response_positions


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    """A copy of its own: the tests write its gradients."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")


def micro_batch(prompt_lens, response_lens, temperature, vocab, seed=0, **flags):
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=generator) for n in prompt_lens]
    responses = [torch.randint(3, vocab, (n,), generator=generator) for n in response_lens]
    nested = lambda rows: torch.nested.as_nested_tensor(rows, layout=torch.jagged)  # noqa: E731
    data = TensorDict(
        {
            "prompts": nested(prompts),
            "responses": nested(responses),
            "input_ids": nested([torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]),
            "position_ids": nested([torch.arange(len(p) + len(r)) for p, r in zip(prompts, responses, strict=True)]),
            "temperature": torch.full((len(prompts),), float(temperature)),
        },
        batch_size=[len(prompts)],
    )
    tu.assign_non_tensor(
        data,
        use_remove_padding=False,
        pad_mode=DatasetPadMode.NO_PADDING,
        calculate_entropy=True,
        use_fused_kernels=False,
        **flags,
    )
    return data


def engine(cls, model):
    """An engine object with just what the two prepare methods read (no process group, no FSDP)."""
    bare = object.__new__(cls)
    bare.module = model
    bare.pad_to_length = None
    bare.use_ulysses_sp = False
    bare.engine_config = type("EngineConfig", (), {"entropy_checkpointing": False})()
    return bare


def run(cls, model, data):
    """Response log-probs and entropies as verl's losses read them, and their loss's gradients."""
    bare = engine(cls, model)
    model.zero_grad()
    inputs, output_args = bare.prepare_model_inputs(data)
    out = bare.prepare_model_outputs(model(**inputs, use_cache=False), output_args, data, None)
    log_probs = no_padding_2_padding(out["log_probs"], data)
    entropy = no_padding_2_padding(out["entropy"], data)
    mask = no_padding_2_padding(
        torch.nested.nested_tensor_from_jagged(
            torch.ones(data["input_ids"].values().shape[0]), data["input_ids"].offsets()
        ),
        data,
    )
    (log_probs * mask).sum().mul(0.7).add((entropy * mask).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return log_probs.detach(), entropy.detach(), mask.bool(), grads, inputs


@settings(max_examples=12, deadline=None)
@example(rows=[(1, 1)], temperature=1.0)  # no gradient on the queries and keys (below)
@given(
    rows=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 24)), min_size=1, max_size=5),
    temperature=st.sampled_from([1.0, 0.7]),
)
def test_same_numbers_as_verl(model, rows, temperature):
    data = micro_batch([p for p, _ in rows], [r for _, r in rows], temperature, model.config.vocab_size)
    verl_lp, verl_ent, mask, verl_grads, _ = run(FSDPEngineWithLMHead, model, data)
    ours_lp, ours_ent, ours_mask, ours_grads, inputs = run(CPUEngineWithLMHead, model, data)
    assert torch.equal(mask, ours_mask)
    # A logit may differ in its last bit: the head's matrix product runs over fewer rows (another
    # blocking of the same sums). A log-prob is a logit minus a logsumexp of magnitude at most ~10
    # here, so a few float32 ulps of 10: 4 x 1.2e-7 x 10.
    torch.testing.assert_close(ours_lp[mask], verl_lp[mask], rtol=0, atol=4 * torch.finfo(torch.float32).eps * 10)
    torch.testing.assert_close(ours_ent[mask], verl_ent[mask], rtol=0, atol=4 * torch.finfo(torch.float32).eps * 10)
    # sums of the same terms in another order: relative 1e-5 of each tensor's norm, or of a thousandth of the
    # whole gradient's where the tensor's is that small: with rows of one prompt token the query and key
    # weights get no gradient at all (a position that attends to itself alone), and float noise of 1e-9
    # compared with float noise fails (hypothesis found rows=[(1, 1)]: 1.5e-8 against 2.4e-8, total 15.7)
    total = torch.sqrt(sum(grad.norm() ** 2 for grad in verl_grads.values()))
    for name, grad in verl_grads.items():
        assert (ours_grads[name] - grad).norm() <= 1e-5 * max(grad.norm(), 1e-3 * total), name
    # the head ran from the shortest prompt's last position on, not over every position, and the
    # right-padded rows went through causal attention with no mask
    assert inputs["logits_to_keep"] == max(p + r for p, r in rows) - min(p for p, _ in rows) + 1
    assert inputs["attention_mask"] is None


def test_verl_flags_fall_back_to_verl(model):
    data = micro_batch([5, 9], [3, 4], 1.0, model.config.vocab_size, calculate_sum_pi_squared=True)
    inputs, output_args = engine(CPUEngineWithLMHead, model).prepare_model_inputs(data)
    assert "logits_to_keep" not in inputs and "logits_from" not in output_args


def test_response_positions_by_hand():
    # rows: prompt 3 + response 2, prompt 2 + response 3; the kept logits start at position 1
    rows, columns, flat = response_positions(torch.tensor([3, 2]), torch.tensor([2, 3]), first=1)
    assert rows.tolist() == [0, 0, 1, 1, 1]
    assert columns.tolist() == [1, 2, 0, 1, 2]  # positions 2, 3 and 1, 2, 3
    assert flat.tolist() == [2, 3, 6, 7, 8]  # row 1 starts at token 5


def test_micro_batches_take_rows_by_length_and_outputs_go_back_in_order(model):
    data = micro_batch([5, 2, 9, 2], [3, 1, 4, 2], 1.0, model.config.vocab_size, use_dynamic_bsz=False)
    order = length_order(data)  # lengths 8, 3, 13, 4
    assert order.tolist() == [1, 3, 0, 2]
    by_length = tu.index_select_tensor_dict(data, order)
    assert by_length["input_ids"].offsets().diff().tolist() == [3, 4, 8, 13]
    assert by_length["responses"].offsets().diff().tolist() == [1, 2, 3, 4]  # every field moved with its row
    back = restore_dynamic_batch(by_length["input_ids"], [order.tolist()])
    assert all(torch.equal(a, b) for a, b in zip(back.unbind(), data["input_ids"].unbind(), strict=True))
    assert length_order(micro_batch([2, 5], [1, 1], 1.0, 50, use_dynamic_bsz=False)) is None  # already in order
    assert length_order(micro_batch([5, 2], [1, 1], 1.0, 50, use_dynamic_bsz=True)) is None  # verl's own grouping
