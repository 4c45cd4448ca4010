"""One evaluated question as a JSON-ready record: prediction, scores and the trajectory the agent played.

Scores are the training rewards' own reading of the answer (`reward.scores.exact_match_score`: the
final output's `<answer>`/`\\boxed{}` from `extra_fields["final_response"]`, 0 for a trajectory that
ended without a valid answer), plus FlashRAG's `acc`: a normalised gold answer is contained in the
normalised prediction.

Turn t is the t-th context of MemSearcher and MEM1 (one per turn) and the t-th generation of ReAct
(one growing context). Its context tokens are the context's length at the end of the turn's last
generation: everything the model attended to in that turn.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_memagent.reward import extract_answer, normalize_answer
from verl_memagent.reward.scores import exact_match_score


def contains_answer(prediction: str | None, golds: list[str]) -> float:
    """FlashRAG's `acc`: 1.0 when a normalised gold answer occurs in the normalised prediction."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(gold) in pred for gold in golds))


def score(extra_fields: dict[str, Any], golds: list[str]) -> tuple[str | None, dict[str, float]]:
    """(prediction, {em, f1, acc}) of a trajectory, read as the training reward reads it."""
    final = extra_fields["final_response"]
    reward = exact_match_score("eval", final, golds, extra_info=extra_fields)
    prediction = extract_answer(final) if reward["has_answer"] else None
    return prediction, {"em": reward["em"], "f1": reward["f1"], "acc": contains_answer(prediction, golds)}


def turn_context_tokens(outputs: list[AgentLoopOutput], one_output_per_context: bool) -> list[int]:
    """Context tokens at the end of each turn's generation (see the module docstring).

    With one output per context each output is a turn; a single growing context (ReAct) has one turn
    per run of generated (mask 1) tokens, ending where the run ends.
    """
    if one_output_per_context:
        return [len(o.prompt_ids) + len(o.response_ids) for o in outputs]
    (output,) = outputs
    mask = [*output.response_mask, 0]
    ends = [i + 1 for i in range(len(output.response_mask)) if mask[i] and not mask[i + 1]]
    return [len(output.prompt_ids) + end for end in ends] or [len(output.prompt_ids) + len(output.response_ids)]


def context_record(output: AgentLoopOutput, tokenizer) -> dict[str, Any]:
    """One LLM context: its ids, texts and counts as the agent loop handed them to verl."""
    fields = output.extra_fields
    return {
        "prompt_text": tokenizer.decode(output.prompt_ids),
        "response_text": tokenizer.decode(output.response_ids),
        "prompt_ids": list(output.prompt_ids),
        "response_ids": list(output.response_ids),
        "response_mask": list(output.response_mask),
        "prompt_tokens": len(output.prompt_ids),
        "response_tokens": len(output.response_ids),
        "generated_tokens": sum(output.response_mask),
        "context_tokens": fields["context_tokens"],
        "prefill_tokens": fields["prefill_tokens"],
        "memory_tokens": fields["memory_tokens"],
        "searches": fields["searches"],
        "retriever_errors": fields["retriever_errors"],
    }


def example_record(
    agent: str, dataset: str, record, outputs: AgentLoopOutput | list[AgentLoopOutput], tokenizer
) -> dict[str, Any]:
    """The JSON line of one question (`record`: a `data.prepare.QARecord`) and what `run()` returned.

    A list (memsearcher, mem1) holds one output per context; a bare output (react) is one context.
    """
    one_output_per_context = isinstance(outputs, list)
    outputs = outputs if one_output_per_context else [outputs]
    fields = outputs[-1].extra_fields
    golds = list(record.golden_answers)
    prediction, scores = score(fields, golds)
    contexts = [context_record(output, tokenizer) for output in outputs]
    return {
        "agent": agent,
        "dataset": dataset,
        "id": record.id,
        "question": record.question,
        "golden_answers": golds,
        "prediction": prediction,
        "final_response": fields["final_response"],
        "scores": scores,
        "finish_reason": fields["finish_reason"],
        "penalised": fields["penalised"],
        "searches": sum(c["searches"] for c in contexts),
        "turn_context_tokens": turn_context_tokens(outputs, one_output_per_context),
        "contexts": contexts,
    }
