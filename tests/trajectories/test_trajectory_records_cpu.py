"""A CPU MemSearcher run (recipes/cpu/run.sh through vLLM at two ranks, 2 GRPO steps, validation after the
last; the session's `memsearcher_vllm_run`, which the recipe tests share) writes trajectory records whose
turns are the samples verl trained on, with the rewards verl's own rollout dump shows and the advantages
GRPO gives them; wandb (offline) and the page show the same trajectories."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from statistics import fmean, stdev

import numpy as np
import pandas as pd
import pytest
from browsing import choose, open_page, wait_ready

from verl_memagent.trajectories.files import read_records
from verl_memagent.trajectories.table import read_offline_tables, table_rows

# verl's main_ppo runs on CPU; the run's vLLM engine took 9 minutes to start on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

EPS = 1e-6  # multi_context_grpo's epsilon


@pytest.fixture(scope="module")
def run(memsearcher_vllm_run) -> Path:
    return memsearcher_vllm_run[0]


def verl_dump(work: Path, step: int) -> dict[str, dict]:
    """verl's own dump of the step's samples by key, less the padding rows it adds to split the batch evenly."""
    rows = map(json.loads, (work / "rollouts" / f"{step}.jsonl").read_text().splitlines())
    return {row["uid"]: row for row in rows if row["input"]}


def without_special_tokens(tokenizer, text: str) -> str:
    """`text` as verl's dump decodes ids (skip_special_tokens=True)."""
    for token in tokenizer.added_tokens_decoder.values():
        text = text.replace(token.content, "") if token.special else text
    return text


def grpo(rewards: list[float]) -> list[float]:
    """multi_context_grpo by hand: (r - mean) / (unbiased std + eps); equal rewards give 0."""
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards) if len(rewards) > 1 else [rewards[0] / (1 + EPS)]
    return [(r - fmean(rewards)) / (stdev(rewards) + EPS) for r in rewards]


def float32_tolerance(rewards: list[float]) -> float:
    """How far float32 GRPO may sit from the float64 one above: verl holds rewards and their mean in float32, and
    rounding them (a few ulps of the largest reward) is magnified by 1 / std when rewards lie close together."""
    spread = stdev(rewards) if len(set(rewards)) > 1 else 1.0
    return 1e-6 + 8 * float(np.finfo(np.float32).eps) * max(map(abs, rewards)) / (spread + EPS)


def test_training_records_are_the_trained_samples_with_their_reward_and_advantage(run, tokenizer):
    metrics = {s["step"]: s["data"] for s in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    advantages = []
    for step in (1, 2):
        records = read_records(run / "checkpoints" / "trajectories" / f"step_{step}.jsonl")
        dump = verl_dump(run, step)
        assert len(records) == 4 and len(dump) == sum(len({t.context_index for t in r.turns}) for r in records)
        rewards: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for record in records:
            keys = [f"{record.uid}_{record.session}_{i}" for i in range(record.turns[-1].context_index + 1)]
            assert [t.sample_key for t in record.turns] == keys  # every context, in turn order
            for turn in record.turns:
                sample = dump[turn.sample_key]
                assert sample["score"] == pytest.approx(record.reward)  # verl copies the score to every turn
                assert without_special_tokens(tokenizer, turn.calls[0].context) == sample["input"]  # its prompt
                assert turn.advantage == pytest.approx(record.advantage, abs=1e-6)  # one per trajectory (GRPO)
            rewards[record.uid].append((record.session, record.reward))
        for uid, sessions in rewards.items():
            sessions.sort()
            group = [reward for _, reward in sessions]
            got = [next(r.advantage for r in records if r.uid == uid and r.session == s) for s, _ in sessions]
            assert got == pytest.approx(grpo(group), abs=float32_tolerance(group))
        assert max(r.advantage for r in records) == pytest.approx(metrics[step]["critic/advantages/max"], abs=1e-5)
        assert min(r.advantage for r in records) == pytest.approx(metrics[step]["critic/advantages/min"], abs=1e-5)
        assert "timing_s/trajectory_records" in metrics[step]
        assert all(r.source == "train" and r.step == step and r.agent == "memsearcher" for r in records)
        advantages += [r.advantage for r in records]
    assert max(abs(a) for a in advantages) > 0.1  # the comparison above is not of zeros only


def test_validation_records_and_wandb_tables_and_page_show_the_same_trajectories(run, browser, tmp_path):
    from selenium.webdriver.common.by import By

    directory = run / "checkpoints" / "trajectories"
    validation = read_records(directory / "validation_step_2.jsonl")
    rows = pd.read_parquet(run / "train.parquet")["extra_info"]
    assert sorted(r.row_id for r in validation) == sorted(info["id"] for info in rows if info["index"] < 4)
    assert all(r.source == "validation" and r.advantage is None and r.reward is not None for r in validation)

    steps = {1: read_records(directory / "step_1.jsonl"), 2: read_records(directory / "step_2.jsonl")}
    tables = read_offline_tables(run / "wandb", "train")
    assert [table["data"] for table in tables] == [table_rows(steps[1]), table_rows(steps[2])]
    (validation_table,) = read_offline_tables(run / "wandb", "validation")
    assert validation_table["data"] == table_rows(validation)

    out = tmp_path / "report.html"
    command = [sys.executable, "-m", "verl_memagent.cli", "show", str(run / "checkpoints"), "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    open_page(browser, out)
    options = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#step option")]
    assert options == ["train step 1 (4)", "validation step 2 (4)", "train step 2 (4)"]
    shown = {}
    for value, label in enumerate(options):
        choose(browser, "step", str(value))
        wait_ready(browser, f"g{value}")
        ids = [c.get_attribute("data-trajectory-id") for c in browser.find_elements(By.CSS_SELECTOR, ".trajectory")]
        shown[label] = ids
    assert shown["train step 1 (4)"] == [row[-1] for row in tables[0]["data"]]
    assert shown["train step 2 (4)"] == [row[-1] for row in tables[1]["data"]]
    assert shown["validation step 2 (4)"] == [row[-1] for row in validation_table["data"]]
