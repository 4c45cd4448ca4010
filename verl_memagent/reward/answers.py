"""Answer extraction, normalisation and matching, as in the SQuAD and FlashRAG evaluation scripts.

The answer is read with the agents' grammar (`verl_memagent.grammar`: tags and boxes).

Normalisation lower-cases, drops punctuation and the articles a/an/the, and collapses whitespace.
Scores take the maximum over the gold answers. F1 follows FlashRAG: a yes/no/noanswer prediction
or gold only scores when both are the same special answer.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable
from typing import Any

from verl_memagent.grammar import extract_boxed, extract_tag

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_SPECIAL = {"yes", "no", "noanswer"}


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def gold_answers(ground_truth: Any) -> list[str]:
    """The gold answers of one question as strings, from a str, a list/array, or `{"target": [...]}`."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, Iterable):
        return [str(answer) for answer in ground_truth]
    raise TypeError(f"ground_truth: expected a string or a list of strings, got {type(ground_truth).__name__}")


def objective_golds(ground_truth: Any) -> list[list[str]]:
    """The gold answers of each objective: one list per objective (MEM1's composed tasks), or the row's
    answers as one objective."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth["target"]
    items = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
    if all(isinstance(item, str) for item in items):
        return [items]
    return [gold_answers(item) for item in items]


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals one normalised gold answer, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in golds))


def f1_score(prediction: str, golds: Iterable[str]) -> float:
    """Best token-level F1 of the prediction against the gold answers."""
    pred = normalize_answer(prediction)
    best = 0.0
    for gold in golds:
        gold_norm = normalize_answer(gold)
        if (pred in _SPECIAL or gold_norm in _SPECIAL) and pred != gold_norm:
            continue
        pred_tokens, gold_tokens = pred.split(), gold_norm.split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred_tokens), common / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def extract_answer(text: str) -> str | None:
    """The final answer of any of our agents: the last `<answer>` span, else the last `\\boxed{}`."""
    answer = extract_tag(text, "answer")
    return answer if answer is not None else extract_boxed(text)


def split_objectives(answer: str, separator: str = ";") -> list[str]:
    """MEM1 multi-objective answers: one answer per objective, separated by `;`."""
    return [part.strip() for part in answer.split(separator)]
