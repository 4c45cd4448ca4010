"""Answer normalisation, EM and F1 against hand-computed values (SQuAD / FlashRAG rules)."""

import pytest

from verl_memagent.reward import (
    exact_match,
    extract_answer,
    extract_boxed,
    extract_tag,
    f1_score,
    gold_answers,
    normalize_answer,
    split_objectives,
)


def test_normalize_drops_case_punctuation_articles_and_extra_spaces():
    assert normalize_answer("  The  Eiffel-Tower, in PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_match_takes_the_best_gold():
    assert exact_match("the Beatles", ["Rolling Stones", "Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0


def test_f1_hand_computed():
    # prediction tokens: [barack, obama, jr]; gold: [barack, obama] -> P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Barack Obama Jr.", ["Barack Obama"]) == pytest.approx(0.8)
    assert f1_score("Paris", ["London", "paris"]) == 1.0
    assert f1_score("Rome", ["Paris"]) == 0.0


def test_f1_yes_no_only_match_exactly():
    assert f1_score("yes", ["yes"]) == 1.0
    assert f1_score("yes it is", ["yes"]) == 0.0  # FlashRAG: a special gold needs the same special prediction
    assert f1_score("no", ["no way"]) == 0.0


def test_extractors():
    assert extract_tag("<answer> a </answer> then <answer>b</answer>", "answer") == "b"
    assert extract_tag("<answer> unclosed", "answer") is None
    assert extract_boxed(r"so \boxed{f(x) = {1, 2}} done") == "f(x) = {1, 2}"
    assert extract_boxed(r"\boxed{open") is None
    assert extract_answer(r"<answer>x</answer> \boxed{y}") == "x"
    assert extract_answer(r"\boxed{y}") == "y"
    assert extract_answer("nothing") is None


def test_gold_answers_shapes():
    assert gold_answers("Paris") == ["Paris"]
    assert gold_answers({"target": ["a", "b"]}) == ["a", "b"]
    assert gold_answers(("a",)) == ["a"]
    with pytest.raises(TypeError, match="ground_truth"):
        gold_answers(3)


def test_split_objectives():
    assert split_objectives(" Paris ; 1969;x ") == ["Paris", "1969", "x"]
