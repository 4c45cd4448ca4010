"""MEM1's N-objective evaluation end to end: `verl-memagent prepare --objectives 2` writes a parquet,
`verl-memagent eval` runs mem1 and react on it and on the same tasks composed on the fly with
`--objectives 2`, with the tiny model in-process and the real BM25 retriever.
"""

from __future__ import annotations

from statistics import fmean

import pytest
from eval_helpers import read_outputs

from verl_memagent.reward.scores import multi_objective_em

AGENTS = ("mem1", "react")
TASKS, SEED = 2, 3


@pytest.fixture(scope="module")
def run(data_dir, retriever_url, tiny_model_dir, tmp_path_factory):
    from verl_memagent.cli import main

    work = tmp_path_factory.mktemp("multi_objective")
    source, parquet = data_dir / "qa_multihop.jsonl", work / "mem1_2.parquet"
    prepare = ["prepare", "--input", f"multihop={source}", "--out", str(parquet), "--agent", "mem1", "--split", "test"]
    assert main([*prepare, "--objectives", "2", "--num-tasks", str(TASKS), "--seed", str(SEED)]) == 0
    argv = ["eval", *(arg for agent in AGENTS for arg in ("--agent", agent))]
    argv += ["--data", f"composed={source}", "--data", f"prepared={parquet}"]
    argv += ["--objectives", "2", "--num-tasks", str(TASKS), "--seed", str(SEED)]
    argv += ["--model", str(tiny_model_dir), "--retriever", retriever_url, "--out", str(work / "eval")]
    assert main([*argv, "--max-turns", "2", "--max-new-tokens", "16", "--concurrency", "4"]) == 0
    return read_outputs(work / "eval")


def test_composed_and_prepared_tasks_are_the_same(run):
    summary, examples = run
    assert summary["datasets"] == {"composed": TASKS, "prepared": TASKS}
    for agent in AGENTS:
        tasks = {
            dataset: sorted(
                (e["id"], e["question"], e["golden_answers"])
                for e in examples
                if (e["agent"], e["dataset"]) == (agent, dataset)
            )
            for dataset in ("composed", "prepared")
        }
        assert tasks["composed"] == tasks["prepared"] and len(tasks["composed"]) == TASKS
        for _, question, golds in tasks["composed"]:
            assert question.count("?") == 2 and len(golds) == 2 and all(isinstance(g, list) for g in golds)


def test_scores_are_mem1s_reward_on_the_final_response(run):
    _, examples = run
    for e in examples:
        info = {"finish_reason": e["finish_reason"], "penalised": e["penalised"]}
        reward = multi_objective_em(e["dataset"], e["final_response"], e["golden_answers"], extra_info=info)
        assert e["scores"]["num_objectives"] == 2
        assert (e["scores"]["em"], e["scores"]["em_fraction"]) == (reward["score"], reward["em_fraction"])


def test_summary_aggregates_em_and_peak_context_tokens(run):
    summary, examples = run
    for agent in AGENTS:
        result = summary["agents"][agent]
        for dataset, scores in result["datasets"].items():
            lines = [e for e in examples if (e["agent"], e["dataset"]) == (agent, dataset)]
            for metric in ("em", "em_fraction", "f1", "acc", "num_objectives"):
                assert scores[metric] == pytest.approx(fmean(e["scores"][metric] for e in lines))
            peaks = [max(e["turn_context_tokens"]) for e in lines]
            assert scores["mean_peak_context_tokens"] == pytest.approx(fmean(peaks))
            assert scores["peak_context_tokens"] == max(peaks)
        assert result["peak_context_tokens"] == max(s["peak_context_tokens"] for s in result["datasets"].values())
