"""`verl-memagent eval` end to end on CPU: the tiny model in-process, the real BM25 retriever, two agents side by side.

Scores of a random model are meaningless; what is checked is that the pipeline is real: the summary
and plot are the aggregates of the per-question lines, the recorded texts and counts are the
tokenizer's on the recorded ids, and the sampled ids are the model's own greedy continuation.
"""

from __future__ import annotations

from statistics import fmean

import pytest
import torch
from eval_helpers import AGENTS, DATASETS, QUESTIONS_PER_DATASET, read_outputs

from verl_memagent.reward.scores import exact_match_score
from verl_memagent.trajectories.files import read_records


@pytest.fixture(scope="module")
def in_process(run_eval_cli, tiny_model_dir):
    return run_eval_cli("--model", str(tiny_model_dir), concurrency=4)


def test_every_agent_answers_every_question(in_process):
    _, summary, examples = in_process
    assert summary["datasets"] == dict.fromkeys(DATASETS, QUESTIONS_PER_DATASET)
    assert sorted((e["agent"], e["dataset"]) for e in examples) == sorted(
        (agent, dataset) for agent in AGENTS for dataset in DATASETS for _ in range(QUESTIONS_PER_DATASET)
    )
    assert summary["sampling_params"]["temperature"] == 0.0
    assert all(s["max_turns"] == 2 and s["max_new_tokens"] == 16 for s in summary["settings"].values())


def test_summary_is_the_aggregate_of_the_lines(in_process):
    _, summary, examples = in_process
    for agent in AGENTS:
        lines = [e for e in examples if e["agent"] == agent]
        result = summary["agents"][agent]
        for name, scores in [*result["datasets"].items(), ("overall", result["overall"])]:
            subset = [e for e in lines if name in ("overall", e["dataset"])]
            assert scores["n"] == len(subset)
            for metric in ("em", "f1", "acc"):
                assert scores[metric] == pytest.approx(fmean(e["scores"][metric] for e in subset))
            assert sum(scores["finish_reasons"].values()) == len(subset)
        per_turn = result["context_tokens_per_turn"]
        assert len(per_turn) == max(len(e["turn_context_tokens"]) for e in lines)
        for row in per_turn:
            values = [
                e["turn_context_tokens"][row["turn"] - 1] for e in lines if len(e["turn_context_tokens"]) >= row["turn"]
            ]
            assert (row["n"], row["mean"], row["peak"]) == (len(values), pytest.approx(fmean(values)), max(values))
        assert result["peak_context_tokens"] == max(row["peak"] for row in per_turn)


def test_plot_exists_and_draws_the_summary(in_process):
    out, summary, _ = in_process
    assert (out / summary["plot"]["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = summary["plot"]["lines"]
    assert sorted(lines) == sorted(AGENTS)
    for agent, drawn in lines.items():
        per_turn = summary["agents"][agent]["context_tokens_per_turn"]
        assert drawn == {
            "turn": [row["turn"] for row in per_turn],
            "mean": [row["mean"] for row in per_turn],
            "peak": [row["peak"] for row in per_turn],
        }


def test_texts_and_token_counts_are_the_tokenizers_on_the_recorded_ids(in_process, tokenizer):
    _, _, examples = in_process
    for example in examples:
        contexts = example["contexts"]
        for c in contexts:
            assert c["prompt_text"] == tokenizer.decode(c["prompt_ids"])
            assert c["response_text"] == tokenizer.decode(c["response_ids"])
            assert (c["prompt_tokens"], c["response_tokens"]) == (len(c["prompt_ids"]), len(c["response_ids"]))
            assert c["context_tokens"] == len(c["prompt_ids"]) + len(c["response_ids"])
            assert c["generated_tokens"] == sum(c["response_mask"])
        # released prompt styles: the final assistant turn, opened by the prompt's <think>, as the reward reads it
        response = tokenizer.decode(contexts[-1]["response_ids"], skip_special_tokens=True)
        assert example["final_response"].startswith("<think>")
        if example["agent"] == "memsearcher":
            assert example["final_response"] == "<think>" + response
        else:  # react: its last turn only
            assert response.endswith(example["final_response"].removeprefix("<think>"))
        if example["agent"] == "memsearcher":
            assert example["turn_context_tokens"] == [c["context_tokens"] for c in contexts]
        else:  # react: one context; its last turn ends where the context ends
            assert example["turn_context_tokens"][-1] <= contexts[0]["context_tokens"]
        assert example["searches"] == sum(c["searches"] for c in contexts)


def test_scores_are_the_training_reward_on_the_final_response(in_process):
    _, _, examples = in_process
    for e in examples:
        info = {"finish_reason": e["finish_reason"], "penalised": e["penalised"]}
        reward = exact_match_score(e["dataset"], e["final_response"], e["golden_answers"], extra_info=info)
        assert (e["scores"]["em"], e["scores"]["f1"]) == (reward["em"], reward["f1"])


def test_sampled_ids_are_the_models_greedy_continuation(in_process, tiny_model):
    _, _, examples = in_process
    for example in examples:
        first = example["contexts"][0]
        generated = (
            first["response_ids"][: first["response_mask"].index(0)]
            if 0 in first["response_mask"]
            else first["response_ids"]
        )
        prompt = torch.tensor([first["prompt_ids"]])
        with torch.no_grad():
            greedy = tiny_model.generate(prompt, max_new_tokens=len(generated), do_sample=False, eos_token_id=None)
        assert generated == greedy[0, prompt.shape[1] :].tolist()


def test_every_trajectory_is_recorded_with_the_training_schema(in_process):
    out, _, examples = in_process
    records = read_records(out / "trajectories" / "eval.jsonl")
    assert sorted((r.agent, r.data_source, r.row_id) for r in records) == sorted(
        (e["agent"], e["dataset"], e["id"]) for e in examples
    )
    lines = {(e["agent"], e["dataset"], e["id"]): e for e in examples}
    for record in records:
        line = lines[(record.agent, record.data_source, record.row_id)]
        assert (record.source, record.step, record.reward, record.reward_info) == (
            "eval",
            None,
            line["scores"]["em"],
            line["scores"],
        )
        assert (record.question, record.finish_reason, record.answer) == (
            line["question"],
            line["finish_reason"],
            line["prediction"],
        )
        assert [turn.context_tokens for turn in record.turns] == line["turn_context_tokens"]
        if record.agent == "memsearcher":  # one context per turn: the action's context is the context's prompt
            assert [t.calls[0].context for t in record.turns] == [c["prompt_text"] for c in line["contexts"]]


def test_a_seeded_sampled_eval_draws_the_same_samples_at_any_concurrency(
    data_dir, retriever_url, tiny_model_dir, tmp_path
):
    from verl_memagent.cli import main

    questions = data_dir / DATASETS["multihop"]

    def sampled(concurrency: int, *seed: str) -> dict:
        out = tmp_path / f"{concurrency}{''.join(seed)}"
        argv = ["eval", "--agent", "memsearcher", "--data", f"one={questions}", "--data", f"two={questions}"]
        argv += ["--limit", "3", "--max-turns", "2", "--max-new-tokens", "16", "--temperature", "1", *seed]
        argv += ["--retriever", retriever_url, "--concurrency", str(concurrency), "--out", str(out)]
        assert main([*argv, "--model", str(tiny_model_dir)]) == 0
        _, examples = read_outputs(out)
        return {(e["dataset"], e["id"]): [c["response_ids"] for c in e["contexts"]] for e in examples}

    seeded = sampled(1, "--set", "sampling_seed=3")
    assert sampled(6, "--set", "sampling_seed=3") == seeded  # one at a time or decoded together: the same samples
    ids = {key for _, key in seeded}
    assert len(ids) == 3 and all(seeded["one", key] != seeded["two", key] for key in ids)  # a repeat draws anew
    assert sampled(1, "--set", "sampling_seed=4") != seeded
    assert sampled(1) != sampled(6)  # unseeded, what a request draws depends on its batch
