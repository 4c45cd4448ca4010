"""verl custom reward functions (`reward.custom_reward_function.path=pkg://verl_memagent.reward.scores`).

Each takes verl's `compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)` and
returns a dict whose `score` is the reward; the other keys become verl's `reward_extra_info`.
The answer is read from the trajectory's final output only (verl scores the last output of an agent
loop's list and copies the score to the others): `extra_info["final_response"]`, which our loops set
to the decoded final response, else `solution_str`. verl 0.9.1 hands `solution_str` over as a slice of
the last response sized by the longest output of the list, so with outputs of different lengths it
is cut or padded; `final_response` is exact. A trajectory the agent loop ended without a valid answer
(`extra_info["finish_reason"]` other than `answer`, e.g. an invalid action or the turn limit) or with a
penalty (`extra_info["penalised"]`, memory overflow in penalty mode) scores 0.

| name | use |
| --- | --- |
| `f1_with_format` | MemSearcher training: 0 broken format, 0.1 valid format but F1 = 0, else F1 |
| `exact_match_score` | evaluation (any agent): EM of the `<answer>` / `\\boxed{}` answer |
| `multi_objective_em` | MEM1: sum over objectives of EM, answers separated by `;` |
"""

from __future__ import annotations

from typing import Any

from verl_memagent.reward.answers import (
    exact_match,
    extract_answer,
    extract_boxed,
    f1_score,
    gold_answers,
    split_objectives,
)

FORMAT_ONLY_REWARD = 0.1


def _penalised(extra_info: Any) -> bool:
    """Whether our agent loop ended the trajectory without a valid answer (its `finish_reason`) or with a penalty."""
    if not isinstance(extra_info, dict):
        return False
    return bool(extra_info.get("penalised")) or extra_info.get("finish_reason", "answer") != "answer"


def _final_response(solution_str: str, extra_info: Any) -> str:
    if isinstance(extra_info, dict) and isinstance(extra_info.get("final_response"), str):
        return extra_info["final_response"]
    return solution_str


def memsearcher_format_ok(text: str) -> bool:
    """MemSearcher's answer turn: at most one closed `<think>` block, then one non-empty `\\boxed{}`, no tool call."""
    if "<tool_call>" in text or text.count("\\boxed{") != 1:
        return False
    opened, closed = text.count("<think>"), text.count("</think>")
    if opened != closed or opened > 1:
        return False
    answer = extract_boxed(text)
    if not answer:
        return False
    return not opened or text.index("</think>") < text.index("\\boxed{")


def f1_with_format(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs) -> dict:
    """MemSearcher's reward: 0 if the format is broken, 0.1 if valid but F1 is 0, otherwise the F1."""
    golds = gold_answers(ground_truth)
    solution_str = _final_response(solution_str, extra_info)
    format_ok = memsearcher_format_ok(solution_str) and not _penalised(extra_info)
    answer = extract_boxed(solution_str) if format_ok else None
    f1 = f1_score(answer, golds) if answer is not None else 0.0
    em = exact_match(answer, golds) if answer is not None else 0.0
    score = (f1 if f1 > 0 else FORMAT_ONLY_REWARD) if format_ok else 0.0
    return {"score": score, "f1": f1, "em": em, "format_ok": float(format_ok)}


def exact_match_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs) -> dict:
    """EM of the final answer (`<answer>` span, else `\\boxed{}`); 0 without an answer."""
    answer = None if _penalised(extra_info) else extract_answer(_final_response(solution_str, extra_info))
    golds = gold_answers(ground_truth)
    em = exact_match(answer, golds) if answer is not None else 0.0
    f1 = f1_score(answer, golds) if answer is not None else 0.0
    return {"score": em, "em": em, "f1": f1, "has_answer": float(answer is not None)}


def _objective_golds(ground_truth: Any) -> list[list[str]]:
    """N gold lists for an N-objective task; a flat list of strings is one objective."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth["target"]
    items = list(ground_truth) if not isinstance(ground_truth, str) else [ground_truth]
    if all(isinstance(item, str) for item in items):
        return [items]
    return [gold_answers(item) for item in items]


def multi_objective_em(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs
) -> dict:
    """MEM1's reward: the sum over objectives of EM (0..N); predicted answers are split on `;`.

    A prediction with fewer parts than objectives scores 0 on the missing ones; extra parts are ignored.
    """
    objectives = _objective_golds(ground_truth)
    answer = None if _penalised(extra_info) else extract_answer(_final_response(solution_str, extra_info))
    parts = split_objectives(answer) if answer is not None else []
    hits = [exact_match(part, golds) for part, golds in zip(parts, objectives, strict=False)]
    total = float(sum(hits))
    return {"score": total, "em_fraction": total / len(objectives), "num_objectives": float(len(objectives))}
