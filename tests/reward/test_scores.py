"""The verl custom reward functions, called with verl's signature; hand-computed scores."""

import numpy as np
import pytest

from verl_memagent.reward.scores import (
    exact_match_score,
    f1_with_format,
    final_answer,
    multi_objective_em,
    multi_objective_em_with_format,
)


def test_f1_with_format_three_levels():
    golds = np.array(["Barack Obama"], dtype=object)  # verl hands parquet lists over as numpy arrays
    right = f1_with_format("nq", r"<think>t</think>\boxed{Barack Obama Jr.}", golds, {})
    assert right["score"] == pytest.approx(0.8) and right["format_ok"] == 1.0
    wrong = f1_with_format("nq", r"<think>t</think>\boxed{Lincoln}", golds, {})
    assert wrong["score"] == 0.1 and wrong["f1"] == 0.0
    broken = f1_with_format("nq", "<think>t</think> Barack Obama", golds, {})
    assert broken["score"] == 0.0 and broken["format_ok"] == 0.0
    # without a record the text is one ended assistant turn under the released rule (verl_memagent/grammar.py)
    assert f1_with_format("nq", r"\boxed{Barack Obama}", golds, {})["score"] == 0.0  # no think block
    assert f1_with_format("nq", r"<think>a</think><think>b</think>\boxed{Barack Obama}", golds, {})["score"] == 1.0


def test_penalised_trajectory_scores_zero():
    extra = {"penalised": True}
    assert f1_with_format("nq", r"\boxed{Paris}", ["Paris"], extra)["score"] == 0.0
    assert exact_match_score("nq", "<answer>Paris</answer>", ["Paris"], extra)["score"] == 0.0
    assert multi_objective_em("nq", "<answer>Paris</answer>", [["Paris"]], extra)["score"] == 0.0


def test_exact_match_score_reads_answer_tag_or_box():
    assert exact_match_score("hotpotqa", "<answer> the Paris </answer>", ["Paris"], None)["score"] == 1.0
    assert exact_match_score("hotpotqa", r"\boxed{paris}", {"target": ["Paris"]}, None)["score"] == 1.0
    missing = exact_match_score("hotpotqa", "Paris", ["Paris"], None)
    assert missing["score"] == 0.0 and missing["has_answer"] == 0.0


def test_multi_objective_sum_of_em():
    golds = np.array([np.array(["Paris"], dtype=object), np.array(["1969", "july 1969"], dtype=object)], dtype=object)
    both = multi_objective_em("mo", "<answer>Paris; July 1969</answer>", golds, {})
    assert both["score"] == 2.0 and both["em_fraction"] == 1.0
    one = multi_objective_em("mo", "<answer>Paris; 1970</answer>", golds, {})
    assert one["score"] == 1.0 and one["em_fraction"] == 0.5
    short = multi_objective_em("mo", "<answer>Paris</answer>", golds, {})
    assert short["score"] == 1.0  # a missing objective scores 0
    single = multi_objective_em("nq", "<answer>Paris</answer>", ["Paris", "Paname"], {})
    assert single["score"] == 1.0 and single["num_objectives"] == 1.0


def test_multi_objective_with_format_term():
    golds = [["Paris"], ["1969"]]
    hit = multi_objective_em_with_format("mo", r"<think>t</think>\boxed{Paris; 1970}", golds, {})
    assert hit["score"] == 1.0 and hit["em_fraction"] == 0.5 and hit["format_ok"] == 1.0
    miss = multi_objective_em_with_format("mo", r"<think>t</think>\boxed{Rome; 1970}", golds, {})
    assert miss["score"] == 0.1 and miss["em_fraction"] == 0.0  # the format term, not an objective
    broken = multi_objective_em_with_format("mo", r"\boxed{Paris; 1969}", golds, {})  # no think block
    assert broken["score"] == 0.0 and broken["em_fraction"] == 0.0 and broken["format_ok"] == 0.0
    recorded = {"final_answer": "Paris; 1969", "final_format_ok": True}
    assert multi_objective_em_with_format("mo", "", golds, recorded)["score"] == 2.0
    assert multi_objective_em_with_format("mo", "", golds, {**recorded, "penalised": True})["score"] == 0.0
    # an answer the agent's rule calls broken earns nothing, though MEM1's sum would count its hits
    unformatted = {"final_answer": "Paris; 1969", "final_format_ok": False}
    assert multi_objective_em_with_format("mo", "", golds, unformatted)["score"] == 0.0
    assert multi_objective_em("mo", "", golds, unformatted)["score"] == 2.0


def test_final_response_from_the_agent_loop_wins_over_verls_slice():
    # verl cuts or pads the last output's response when the list's outputs differ in length
    extra = {"final_response": r"<think>t</think>\boxed{Leda}"}
    assert f1_with_format("nq", r"<think>t</think>\boxed{Le", ["Leda"], extra)["score"] == 1.0
    assert exact_match_score("nq", "", ["Leda"], {"final_response": "<answer>Leda</answer>"})["score"] == 1.0
    assert multi_objective_em("mo", "", [["a"], ["b"]], {"final_response": "<answer>a; b</answer>"})["score"] == 2.0


def test_the_agents_record_is_scored_not_the_text():
    text = r"<think>a</think><think>b\boxed{Leda} <answer>Leer</answer>"
    recorded = {"final_response": text, "finish_reason": "answer", "final_answer": "Leda", "final_format_ok": True}
    assert f1_with_format("nq", text, ["Leda"], {"final_response": text})["score"] == 0.0  # default grammar
    assert f1_with_format("nq", text, ["Leda"], recorded)["score"] == 1.0
    assert exact_match_score("nq", text, ["Leda"], recorded)["score"] == 1.0
    assert final_answer(text, {"final_response": text}) == "Leer"  # fallback: the <answer> span first
    assert multi_objective_em("mo", "", [["Leda"]], {**recorded, "final_answer": "Leda; x"})["score"] == 1.0
    unformatted = {**recorded, "final_format_ok": False}
    assert f1_with_format("nq", text, ["Leda"], unformatted)["score"] == 0.0
    assert exact_match_score("nq", text, ["Leda"], unformatted)["score"] == 1.0  # EM reads no format
    no_answer = {"finish_reason": "max_turns", "final_answer": None, "final_format_ok": False}
    assert exact_match_score("nq", "<answer>Leda</answer>", ["Leda"], no_answer)["score"] == 0.0
    # the record is the agent's word: under the released rules an answer a trajectory ended without
    # (`no_memory`: its memory rewrite held a box) still scores, as the released reward scored it
    memory_answer = {"finish_reason": "no_memory", "final_answer": "Leda", "final_format_ok": True}
    assert f1_with_format("nq", "", ["Leda"], memory_answer)["score"] == 1.0
    assert f1_with_format("nq", "", ["Leda"], {**memory_answer, "penalised": True})["score"] == 0.0
