"""The FSDP2 engine verl's trainer runs on CPU: rows of like length, no mask, the head at response positions only.

Without remove-padding (the CPU path: it needs flash-attention's varlen kernels) verl's engine
(`FSDPEngineWithLMHead.prepare_model_outputs`, workers/engine/fsdp/transformer_impl.py) projects every
position of every row onto the vocabulary, takes the entropy at every position, and the
log-probabilities one position at a time (`logprobs_from_logits_v2` loops over positions to bound GPU
memory: a Python call and an autograd node per token). Only the response's positions are ever read
(`no_padding_2_padding`, workers/utils/padding.py). Here the head runs from the first position any row's
response needs (the model's `logits_to_keep`), and the log-probabilities and entropies of the response
positions are taken in one call each, with verl's formulas. Every other position holds 0, which
nothing reads. On the learning demo's rows (prompts of 300-450 tokens, responses of 20-200) this is most of
the head's work and all of the per-token loop (benchmarks/rl_step.py).

The rows are right-padded, so they go through causal attention with no mask (`prepare_model_inputs`),
and micro-batches are formed of rows of like length (`forward_backward_batch`): less padding, a
narrower head. docs/cpu.md, "Speed", has the measured share of each. Cases this does not cover
(remove-padding, fused kernels, distillation, the sum of squared probabilities) go to verl's own code
unchanged.

With `MEMAGENT_CPU_ENGINE_SHAPES=FILE` in the environment, every micro-batch's forward appends its
padded shape to FILE (a JSON line: rows, padded width, head width, real and response tokens, whether it
trains): what `benchmarks/rl_step.py` reports as the padded tokens a step computes.
"""

from __future__ import annotations

import json
import os

import torch
from verl.utils import tensordict_utils as tu
from verl.utils import torch_functional as verl_F
from verl.utils.dataset.dataset_utils import DatasetPadMode
from verl.utils.seqlen_balancing import restore_dynamic_batch
from verl.workers.engine.fsdp import transformer_impl

#: micro-batch flags under which verl's own output path runs (this module does not implement them)
_VERL_ONLY_FLAGS = ("use_fused_kernels", "calculate_sum_pi_squared", "distillation_use_topk", "distillation_only")


def _handled(micro_batch) -> bool:
    """Whether this engine's response-only path applies to `micro_batch` (else verl's runs)."""
    if tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
        return False
    if tu.get_non_tensor_data(data=micro_batch, key="pad_mode", default=DatasetPadMode.NO_PADDING) != (
        DatasetPadMode.NO_PADDING
    ):
        return False
    if any(tu.get_non_tensor_data(data=micro_batch, key=flag, default=False) for flag in _VERL_ONLY_FLAGS):
        return False
    return micro_batch["prompts"].is_nested and micro_batch["responses"].is_nested


def counts_from_zero(position_ids: torch.Tensor) -> bool:
    """Whether every row's positions are 0, 1, 2, ... (a text model's; not multimodal rotary positions)."""
    if position_ids.dim() != 2:
        return False
    lengths = position_ids.offsets().diff()
    starts = torch.repeat_interleave(position_ids.offsets()[:-1], lengths)
    expected = torch.arange(int(lengths.sum()), device=starts.device) - starts
    return torch.equal(position_ids.values(), expected)


def response_positions(prompt_lens: torch.Tensor, response_lens: torch.Tensor, first: int):
    """Index tensors of every response token's predicting position, all rows in order.

    Returns `(rows, columns, flat)`: the row and the column within the kept logits (which start at
    position `first`) of the position that predicts each response token, and that position's index in
    the row-major concatenation of the rows' real tokens (verl's nested layout).
    """
    rows = torch.repeat_interleave(torch.arange(len(prompt_lens)), response_lens)
    row_starts = torch.cumsum(response_lens, 0) - response_lens
    within = torch.arange(int(response_lens.sum())) - torch.repeat_interleave(row_starts, response_lens)
    positions = torch.repeat_interleave(prompt_lens - 1, response_lens) + within
    sequence_starts = torch.cumsum(prompt_lens + response_lens, 0) - (prompt_lens + response_lens)
    return rows, positions - first, torch.repeat_interleave(sequence_starts, response_lens) + positions


def log_shape(path: str, micro_batch, width: int, head_width: int) -> None:
    """Append one micro-batch's padded shape to `path` (see the module's docstring)."""
    shape = {
        "rows": len(micro_batch["prompts"].offsets()) - 1,
        "width": width,
        "head_width": head_width,
        "tokens": int(micro_batch["input_ids"].offsets()[-1]),
        "response_tokens": int(micro_batch["responses"].offsets()[-1]),
        "trains": torch.is_grad_enabled(),
    }
    with open(path, "a") as log:
        log.write(json.dumps(shape) + "\n")


def length_order(data) -> torch.Tensor | None:
    """Rows ordered by length (stable), for micro-batches of rows alike; None where verl forms its own
    (dynamic batch size) or the order would not change."""
    if tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True) or not _handled(data):
        return None
    order = torch.argsort(data["input_ids"].offsets().diff(), stable=True)
    return None if torch.equal(order, torch.arange(len(order))) else order


class CPUEngineWithLMHead(transformer_impl.FSDPEngineWithLMHead):
    """verl's FSDP engine with micro-batches of rows of like length, and the head and the log-probabilities
    restricted to response positions."""

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        """verl's, over the rows sorted by length, and the model's outputs put back in the rows' order.

        verl cuts a batch into micro-batches in its rows' order and pads each to its longest row: on the
        learning demo a quarter of the tokens computed were padding, and the head ran from each micro-batch's
        shortest prompt. Sorted, rows alike share a micro-batch. The gradient is the same sum in another
        order (verl normalises the loss by the whole batch's tokens); per-micro-batch metrics such as the
        clip fraction are averaged over other groupings.
        """
        order = length_order(data)
        if order is None:
            return super().forward_backward_batch(data, loss_function, forward_only)
        outputs = super().forward_backward_batch(tu.index_select_tensor_dict(data, order), loss_function, forward_only)
        if outputs is not None:
            for key, value in outputs["model_output"].items():
                outputs["model_output"][key] = restore_dynamic_batch(value, [order.tolist()])
        return outputs

    def prepare_model_inputs(self, micro_batch):
        model_inputs, output_args = super().prepare_model_inputs(micro_batch)
        if _handled(micro_batch):
            rows, width = model_inputs["input_ids"].shape
            first = int(micro_batch["prompts"].offsets().diff().min()) - 1
            model_inputs["logits_to_keep"] = width - first
            output_args["logits_from"] = first
            if counts_from_zero(micro_batch["position_ids"]):
                # Rows are right-padded: causal attention alone keeps every real token from the padding
                # after it, so no mask is built and attention skips the blocks above the diagonal.
                # Positions counting on through the padding tell transformers the rows are not packed.
                model_inputs["attention_mask"] = None
                model_inputs["position_ids"] = torch.arange(width, device=model_inputs["input_ids"].device).expand(
                    rows, width
                )
            if shapes := os.environ.get("MEMAGENT_CPU_ENGINE_SHAPES"):
                log_shape(shapes, micro_batch, width, width - first)
        return model_inputs, output_args

    def prepare_model_outputs(self, output, output_args, micro_batch, logits_processor_func):
        if "logits_from" not in output_args:
            return super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
        prompt_lens = micro_batch["prompts"].offsets().diff().cpu()
        response_lens = micro_batch["responses"].offsets().diff().cpu()
        rows, columns, flat = response_positions(prompt_lens, response_lens, output_args["logits_from"])
        temperature = output_args["temperature"].unsqueeze(-1).unsqueeze(-1)
        logits = transformer_impl._scale_logits_by_temperature(
            output.logits, temperature, is_unit_temperature=output_args.get("temperature_is_one", False)
        )
        logits = logits[rows, columns]  # (response tokens, vocabulary)
        labels = micro_batch["responses"].values()
        # verl's formula (logprobs_from_logits_v2 in float32): the label's logit minus the row's logsumexp
        log_probs = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        cu_seqlens = micro_batch["input_ids"].offsets()
        total = int(cu_seqlens[-1])

        def nested(values: torch.Tensor) -> torch.Tensor:
            full = values.new_zeros(total).index_copy(0, flat.to(values.device), values)
            return torch.nested.nested_tensor_from_jagged(full, cu_seqlens)

        model_output = {"log_probs": nested(log_probs)}
        if tu.get_non_tensor_data(data=micro_batch, key="calculate_entropy", default=False):
            model_output["entropy"] = nested(verl_F.entropy_from_logits(logits))
        return model_output
