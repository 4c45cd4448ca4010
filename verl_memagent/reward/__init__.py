"""Rule-based rewards for the search agents, usable as verl custom reward functions.

Pure functions of text; nothing here imports verl or the agent code. Recipes point verl at them with
`reward.custom_reward_function.path=pkg://verl_memagent.reward.<module>` and `.name=compute_score`.
"""

from verl_memagent.grammar import extract_boxed, extract_tag
from verl_memagent.reward.answers import (
    exact_match,
    extract_answer,
    f1_score,
    gold_answers,
    normalize_answer,
    split_objectives,
)

__all__ = [
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "extract_tag",
    "f1_score",
    "gold_answers",
    "normalize_answer",
    "split_objectives",
]
