"""verl custom reward functions (`reward.custom_reward_function.path=pkg://verl_memagent.reward.scores`).

Each takes verl's `compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)` and
returns a dict whose `score` is the reward; the other keys become verl's `reward_extra_info`.
verl merges the agent loop's `extra_fields` into `extra_info` and scores the trajectory's final output
(the last of an agent loop's list; the score is copied to the others).

The agent owns the grammar of its outputs: our loops parse the final context with their configured tags
and record `extra_info["final_answer"]` (the answer, or None) and `extra_info["final_format_ok"]` (the
format verdict, `verl_memagent.grammar`; false for a trajectory their rules end without a valid answer). The
rewards score that record. Outputs without one, such as plain completions in `verl-memagent eval`, are
parsed here with the default tags (`<answer>`, `\\boxed{}`, `<think>`, `<tool_call>`; MemSearcher's
released format rule on the text as one ended assistant turn), from `extra_info["final_response"]` if
present (verl 0.9.1 hands `solution_str` over as a slice of the last response sized by the longest
output of the list), else `solution_str`; such an output scores 0 when `extra_info["finish_reason"]`
says our loop ended it without an answer. A trajectory ended with a penalty (`extra_info["penalised"]`,
memory overflow in penalty mode) scores 0.

| name | use |
| --- | --- |
| `f1_with_format` | MemSearcher training: 0 broken format, 0.1 valid format but F1 = 0, else F1 |
| `exact_match_score` | evaluation (any agent): EM of the final answer |
| `multi_objective_em` | MEM1: sum over objectives of EM, answers separated by `;` |
| `multi_objective_em_with_format` | MEM1's sum with MemSearcher's format term: 0 broken, 0.1 valid with no hit |
"""

from __future__ import annotations

from typing import Any

from verl_memagent.grammar import released_verdict
from verl_memagent.output_fields import FinishReason, OutputField
from verl_memagent.reward.answers import (
    exact_match,
    extract_answer,
    f1_score,
    gold_answers,
    objective_golds,
    split_objectives,
)

FORMAT_ONLY_REWARD = 0.1


def _penalised(extra_info: Any) -> bool:
    """Whether the trajectory earns nothing whatever its text: a penalty, or (for outputs without the
    agent's record) our loop ended it without an answer (its `finish_reason`)."""
    if not isinstance(extra_info, dict):
        return False
    ended_without_answer = (
        OutputField.FINAL_FORMAT_OK not in extra_info
        and extra_info.get(OutputField.FINISH_REASON, FinishReason.ANSWER) != FinishReason.ANSWER
    )
    return bool(extra_info.get(OutputField.PENALISED)) or ended_without_answer


def _final_response(solution_str: str, extra_info: Any) -> str:
    if isinstance(extra_info, dict) and isinstance(extra_info.get(OutputField.FINAL_RESPONSE), str):
        return extra_info[OutputField.FINAL_RESPONSE]
    return solution_str


def _recorded(extra_info: Any) -> tuple[str | None, bool] | None:
    """(final answer, format verdict) as the agent loop recorded them, or None for outputs without a record."""
    if not isinstance(extra_info, dict) or OutputField.FINAL_FORMAT_OK not in extra_info:
        return None
    answer = extra_info.get(OutputField.FINAL_ANSWER)
    return (answer if isinstance(answer, str) else None), bool(extra_info[OutputField.FINAL_FORMAT_OK])


def final_answer(solution_str: str, extra_info: Any = None) -> str | None:
    """The answer `exact_match_score` and `multi_objective_em` score: the one the agent recorded, else the
    last `<answer>` span (or box) of the final response; None without one or when penalised."""
    if _penalised(extra_info):
        return None
    recorded = _recorded(extra_info)
    return recorded[0] if recorded is not None else extract_answer(_final_response(solution_str, extra_info))


def _format_verdict(solution_str: str, extra_info: Any = None) -> tuple[str | None, bool]:
    """(answer, format ok) under MemSearcher's format rule: the agent's record, else the released rule on the
    text as one ended assistant turn; a broken format or a penalty has no answer."""
    recorded = _recorded(extra_info)
    if recorded is None:
        recorded = released_verdict([_final_response(solution_str, extra_info)], ended=True)
    answer, format_ok = recorded
    format_ok = format_ok and answer is not None and not _penalised(extra_info)
    return (answer if format_ok else None), format_ok


def _with_format_term(score: float, format_ok: bool) -> float:
    """MemSearcher's format term on a score: kept when above 0, else 0.1 for a valid format and 0 for a broken one."""
    return score if score > 0 else (FORMAT_ONLY_REWARD if format_ok else 0.0)


def f1_with_format(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs) -> dict:
    """MemSearcher's reward: 0 if the format is broken, 0.1 if valid but F1 is 0, otherwise the F1."""
    golds = gold_answers(ground_truth)
    answer, format_ok = _format_verdict(solution_str, extra_info)
    f1 = f1_score(answer, golds) if answer is not None else 0.0
    em = exact_match(answer, golds) if answer is not None else 0.0
    score = _with_format_term(f1, format_ok)
    return {"score": score, "f1": f1, "em": em, "format_ok": float(format_ok)}


def exact_match_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs) -> dict:
    """EM of the final answer (see `final_answer`); 0 without an answer."""
    answer = final_answer(solution_str, extra_info)
    golds = gold_answers(ground_truth)
    em = exact_match(answer, golds) if answer is not None else 0.0
    f1 = f1_score(answer, golds) if answer is not None else 0.0
    return {"score": em, "em": em, "f1": f1, "has_answer": float(answer is not None)}


def multi_objective_em(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs
) -> dict:
    """MEM1's reward: the sum over objectives of EM (0..N); predicted answers are split on `;`.

    A prediction with fewer parts than objectives scores 0 on the missing ones; extra parts are ignored.
    """
    return _objective_hits(final_answer(solution_str, extra_info), ground_truth)


def multi_objective_em_with_format(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs
) -> dict:
    """MEM1's sum of EM with MemSearcher's format term (`f1_with_format`'s): 0 when the format is broken, 0.1
    when it is valid and no objective is hit. An option of the papers' regime on the composed task, where most
    groups of eight-objective questions otherwise score all zero and teach nothing; tried there and not taken
    (benchmarks/RESULTS.md, "levers for the long questions"). `em_fraction` stays the EM."""
    answer, format_ok = _format_verdict(solution_str, extra_info)
    hits = _objective_hits(answer, ground_truth)
    return {**hits, "score": _with_format_term(hits["score"], format_ok), "format_ok": float(format_ok)}


def _objective_hits(answer: str | None, ground_truth: Any) -> dict:
    """The objectives `answer` hits (EM of each `;`-separated part against its objective's golds), summed."""
    objectives = objective_golds(ground_truth)
    parts = split_objectives(answer) if answer is not None else []
    hits = [exact_match(part, golds) for part, golds in zip(parts, objectives, strict=False)]
    total = float(sum(hits))
    return {"score": total, "em_fraction": total / len(objectives), "num_objectives": float(len(objectives))}
