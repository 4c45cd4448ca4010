"""One evaluated task as a JSON-ready record: prediction, scores and the trajectory the agent played.

Scores are the training rewards' own reading of the answer (`reward.scores.final_answer`: the answer
the agent loop recorded, none for a trajectory that ended without a valid answer), chosen by the shape
of the ground truth:

- a flat list of gold answers is one question: `reward.scores.exact_match_score` (EM, F1) plus
  FlashRAG's `acc` (a normalised gold answer is contained in the normalised prediction);
- a list of N gold lists is MEM1's N-objective task: `reward.scores.multi_objective_em` gives `em`
  (the sum of EM over objectives, 0..N, as MEM1 reports it) and `em_fraction` (em / N); F1 and acc
  are those of each `;`-separated part against its objective, averaged over the N objectives.

A single question is the one-objective case (`em_fraction` = `em`, `num_objectives` = 1).

Turn t is the t-th context of MemSearcher and MEM1 (one per turn) and the t-th generation of ReAct
(one growing context). Its context tokens are the context's length at the end of the turn's last
generation: everything the model attended to in that turn.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_memagent.agent.trajectory import question_of
from verl_memagent.output_fields import OutputField
from verl_memagent.reward import f1_score, gold_answers, normalize_answer, split_objectives
from verl_memagent.reward.scores import exact_match_score, final_answer, multi_objective_em
from verl_memagent.trajectories.build import ContextSample, build_record
from verl_memagent.trajectories.schema import TrajectoryRecord


def contains_answer(prediction: str | None, golds: list[str]) -> float:
    """FlashRAG's `acc`: 1.0 when a normalised gold answer occurs in the normalised prediction."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(gold) in pred for gold in golds))


def objective_golds(ground_truth: Any) -> list[list[str]] | None:
    """The N gold lists of a multi-objective task, or None for one question's flat list of answers."""
    if isinstance(ground_truth, str) or any(isinstance(item, str) for item in ground_truth):
        return None
    return [list(golds) for golds in ground_truth]


def score(extra_fields: dict[str, Any], ground_truth: Any) -> tuple[str | None, dict[str, float]]:
    """(prediction, {em, em_fraction, f1, acc, num_objectives}) of a trajectory, read as the reward reads it."""
    final = extra_fields[OutputField.FINAL_RESPONSE]
    objectives = objective_golds(ground_truth)
    golds = gold_answers(ground_truth) if objectives is None else []
    reading = exact_match_score("eval", final, golds, extra_info=extra_fields)
    prediction = final_answer(final, extra_fields)
    if objectives is None:
        em = reading["em"]
        return prediction, {
            "em": em,
            "em_fraction": em,
            "f1": reading["f1"],
            "acc": contains_answer(prediction, golds),
            "num_objectives": 1,
        }
    reward = multi_objective_em("eval", final, objectives, extra_info=extra_fields)
    parts = split_objectives(prediction) if prediction is not None else []
    parts += [None] * (len(objectives) - len(parts))  # a missing part scores 0, as in the reward
    pairs = list(zip(parts, objectives, strict=False))
    return prediction, {
        "em": reward["score"],
        "em_fraction": reward["em_fraction"],
        "f1": fmean(f1_score(part, golds) if part is not None else 0.0 for part, golds in pairs),
        "acc": fmean(contains_answer(part, golds) for part, golds in pairs),
        "num_objectives": len(objectives),
    }


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
        "context_tokens": fields[OutputField.CONTEXT_TOKENS],
        "prefill_tokens": fields[OutputField.PREFILL_TOKENS],
        "memory_tokens": fields[OutputField.MEMORY_TOKENS],
        "searches": fields[OutputField.SEARCHES],
        "retriever_errors": fields[OutputField.RETRIEVER_ERRORS],
    }


def example_record(
    agent: str, dataset: str, row: dict[str, Any], outputs: AgentLoopOutput | list[AgentLoopOutput], tokenizer
) -> dict[str, Any]:
    """The JSON line of one task (`row`: the kwargs `run()` got) and what `run()` returned.

    A list (memsearcher, mem1) holds one output per context; a bare output (react) is one context.
    """
    one_output_per_context = isinstance(outputs, list)
    outputs = outputs if one_output_per_context else [outputs]
    fields = outputs[-1].extra_fields
    golds = row["reward_model"]["ground_truth"]
    prediction, scores = score(fields, golds)
    contexts = [context_record(output, tokenizer) for output in outputs]
    return {
        "agent": agent,
        "dataset": dataset,
        "id": row["extra_info"].get("id", row["index"]),
        "question": question_of(row),
        "golden_answers": golds,
        "prediction": prediction,
        "final_response": fields[OutputField.FINAL_RESPONSE],
        "scores": scores,
        "finish_reason": fields[OutputField.FINISH_REASON],
        "penalised": fields[OutputField.PENALISED],
        "searches": sum(c["searches"] for c in contexts),
        "turn_context_tokens": turn_context_tokens(outputs, one_output_per_context),
        "contexts": contexts,
    }


def trajectory_record(
    example: dict[str, Any], outputs: AgentLoopOutput | list[AgentLoopOutput], tokenizer
) -> TrajectoryRecord:
    """The task's trajectory record (docs/trajectories.md), the same schema as training's: its data source
    is the dataset's name, its reward the EM score, `reward_info` all the scores."""
    outputs = outputs if isinstance(outputs, list) else [outputs]
    contexts = [ContextSample(o.prompt_ids, o.response_ids, o.extra_fields) for o in outputs]
    return build_record(
        contexts,
        tokenizer,
        source="eval",
        step=None,
        data_source=example["dataset"],
        golden_answers=example["golden_answers"],
        reward=example["scores"]["em"],
        reward_info=example["scores"],
        row_id=example["id"],
    )
