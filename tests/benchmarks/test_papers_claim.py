"""`benchmarks/papers_claim.py` in little: MemSearcher scored, trained one step by verl's real trainer in the
papers' regime at the recipe's settings (composed_doors_fresh.yaml: fresh RL questions of every k, one update
over the batch, the chosen lr and KL), scored again on the dev and test splits, its records resumed and
reported. One verl launch (slow tier); the command line's checks and the RL launches, composed as the
launcher prints them, in the quick tier."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import papers_claim
import pytest
from omegaconf import OmegaConf

from memagent_examples.composed_doors.task import write_door_sets
from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.papers_claim import records as claim_records
from memagent_examples.papers_claim import report as claim_report
from memagent_examples.papers_claim.records import AGENTS
from memagent_examples.papers_claim.sweep import AGENT_LOOPS, Sweep, shipped_seed
from verl_memagent.recipe_check import compose, dry_run

REPO = Path(__file__).resolve().parents[2]

TINY_STEP = (
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "trainer.total_training_steps=1",
    "trainer.save_freq=1",
)
#: the papers' regime's step at the same size: its own mini-batch is the whole batch, and no validation
#: pass (the sweep scores the splits itself; the recipe's dev validation is composed below)
TINY_FRESH_STEP = (
    *TINY_STEP,
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)
#: the swept cells' evaluation questions per split and k, the test split among them
TINY_EVAL = {"dev": 2, "unseen": 2, "test": 2}
FRESH_SIZES = {"objectives": (1, 2), "eval_tasks": TINY_EVAL, "rl_overrides": TINY_FRESH_STEP, "regime": "fresh"}


def seeded_build(work: Path, model: Path) -> None:
    """The build with the session's tiny model as every agent's start, so that no warm start runs here."""
    for piece in ("model", "copy/model", *(f"warm/{agent}/model" for agent in AGENTS)):
        shutil.copytree(model, work / "build" / piece)
        marker = work / "build" / piece
        (marker if piece == "model" else marker.parent).joinpath("complete").touch()


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("papers_claim")
    seeded_build(work, tiny_model_dir)
    sweep = Sweep(work, work / "papers_claim.json", **FRESH_SIZES)
    try:
        sweep.prepare()
        sweep.sweep(seeds=1, agents=("memsearcher",))
    finally:
        sweep.retriever.stop()
    return work, sweep


@pytest.mark.slow
def test_records_cover_every_cell_with_the_papers_figures(swept):
    work, sweep = swept
    records = json.loads((work / "papers_claim.json").read_text())
    cells = {(r["agent"], claim_records.record_phase(r), r["seed"], r["door_set"], r["objectives"]) for r in records}
    expected = {
        ("memsearcher", phase, seed, door_set, k)
        for phase, seed in (("before_rl", None), ("after_rl_fresh", 0))
        for door_set in ("dev", "unseen", "test")
        for k in (1, 2)
    }
    assert cells == expected and len(records) == len(expected)
    for record in records:
        assert record["questions"] == 2 and 0 <= record["em"] <= 1
        assert min(record[key] for key in ("peak_context_tokens", "prefill_tokens_per_question", "turns")) > 0
        assert record["cpu"]["model"] and record["warm_start_sha256"] == records[0]["warm_start_sha256"]
        assert record["rl_objectives"] == ([1, 2, 4, 8] if record["phase"] == "after_rl" else None)
        if record["phase"] == "after_rl":  # the settings a cell was trained with are in its records
            assert (record["regime"], record["settings"]) == ("fresh", list(TINY_FRESH_STEP))
    examples = work / "eval" / "memsearcher_after_rl_fresh_0" / "k2_dev-unseen-test" / "examples.jsonl"
    assert all(json.loads(line)["golden_answers"].__len__() == 2 for line in examples.read_text().splitlines())


@pytest.mark.slow
def test_the_rl_step_ran_in_verl_and_the_trained_policy_was_scored(swept):
    work, _ = swept
    run = work / "rl" / "memsearcher_fresh_seed0"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "critic/score/mean" in s["data"]] == [1]
    assert (run / "checkpoints" / "global_step_1" / "actor" / "huggingface" / "config.json").is_file()
    eval_dir = work / "eval" / "memsearcher_after_rl_fresh_0" / "k1_dev-unseen-test"
    summary = json.loads((eval_dir / "summary.json").read_text())
    assert str(run / "checkpoints" / "global_step_1") in json.dumps(summary["run"])


@pytest.mark.slow
def test_a_resumed_sweep_runs_no_cell_twice_and_reports(swept, tmp_path, capsys):
    work, sweep = swept
    before = (work / "papers_claim.json").read_text()
    again = Sweep(work, work / "papers_claim.json", **FRESH_SIZES)
    again.retriever = sweep.retriever  # no cell is left, so nothing asks it
    again.sweep(seeds=1, agents=("memsearcher",))
    assert (work / "papers_claim.json").read_text() == before
    summary = claim_report.report(json.loads(before), plot_path=tmp_path / "plot.png")
    out = capsys.readouterr().out
    assert "test doors:" in out  # the final figures' split, where it was scored
    assert "| memsearcher | before_rl | - |" in out and "| memsearcher | after_rl_fresh | 1 |" in out
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG" and summary["cpu"]["model"]


def test_agents_are_chosen_by_name_and_an_unknown_one_is_refused(capsys):
    assert papers_claim.agent_list("mem1,react") == ("mem1", "react")
    with pytest.raises(SystemExit):
        papers_claim.main(["--agents", "mem1,memagent", "--work", "unused"])
    assert "unknown agent(s) ['memagent']: choose from memsearcher,mem1,react" in capsys.readouterr().err


def test_the_committed_records_grew_from_the_shipped_warm_starts(capsys):
    """What `--start shipped` (the default) trains from is what the committed JSON's cells grew from, so
    a sweep on another machine resumes them rather than mixing in a second warm start."""
    records = json.loads(papers_claim.RESULTS["mem1"].read_text())
    grown_from = {(r["agent"], r["warm_start_sha256"]) for r in records}
    shipped = {(a, claim_records.file_digest(SHIPPED_STARTS / a / "model.safetensors")) for a in AGENTS}
    assert grown_from == shipped and shipped_seed(AGENTS) == 0
    with pytest.raises(SystemExit):
        papers_claim.main(["--work", "unused", "--warm-steps", "300"])
    assert "--warm-steps: settings of a build; add --start build, or leave them out" in capsys.readouterr().err


def test_the_report_refuses_records_of_two_warm_starts_of_one_agent(tmp_path):
    record = {"agent": "mem1", "phase": "before_rl", "seed": None, "door_set": "dev", "objectives": 1}
    records = [{**record, "warm_start_sha256": "a"}, {**record, "objectives": 2, "warm_start_sha256": "b"}]
    claim_records.check_one_warm_start(records[:1])
    assert len(claim_report.grouped(records[:1], "dev")) == 1
    with pytest.raises(ValueError, match=r"more than one warm start \{'mem1': \['a', 'b'\]\}"):
        claim_report.report(records, plot_path=tmp_path / "plot.png")
    assert not (tmp_path / "plot.png").exists()  # refused before anything is drawn


def test_a_mixed_rl_set_composes_each_k_on_the_rl_doors_and_is_a_phase_of_its_own(tmp_path, tokenizer, capsys):
    import pandas as pd

    write_door_sets(tmp_path / "build" / "task", tokenizer, REPO / "data" / "corpus.jsonl")
    mem1s, mixed = (Sweep(tmp_path, tmp_path / "r.json", rl_objectives=ks) for ks in ((2,), (1, 2, 8)))
    rows = pd.read_parquet(mixed.rl_data("mem1", 0))
    assert (
        mixed.rl_data("mem1", 0).name == "rl_mem1_k1-2-8.parquet" and mem1s.rl_data("mem1", 0).name == "rl_mem1.parquet"
    )
    assert rows.extra_info.map(lambda info: info["objectives"]).value_counts().to_dict() == {1: 48, 2: 48, 8: 48}
    assert rows.extra_info.map(lambda info: info["index"]).tolist() == list(range(144))
    assert all(
        len(row["ground_truth"]) == row_info["objectives"]
        for row, row_info in zip(rows.reward_model, rows.extra_info, strict=True)
    )
    assert all(source == "rl" for info in rows.extra_info for source in info["sources"])
    assert set(pd.read_parquet(mem1s.rl_data("mem1", 0)).data_source) == {"multi_objective_2"}

    record = {"agent": "mem1", "door_set": "dev", "objectives": 8, "em": 0.5, "peak_context_tokens": 900}
    record |= {"answered": 1.0, "seconds_per_question": 1.0, "warm_start_sha256": "a", "cpu": {"model": "x"}}
    before = {**record, "phase": "before_rl", "seed": None, "rl_objectives": None}
    after_k2 = {**record, "phase": "after_rl", "seed": 0, "rl_objectives": [2]}
    mem1s.records = mixed.records = [before, after_k2]
    mem1s.eval_tasks = mixed.eval_tasks = {"dev": 24}
    assert not mem1s.missing("mem1", "after_rl", 0) and mixed.missing("mem1", "after_rl", 0) == ["dev"]
    assert not mixed.missing("mem1", "before_rl", None)  # one warm start, scored once for every RL set
    after_mixed = {**record, "phase": "after_rl", "seed": 0, "rl_objectives": [1, 2, 8], "em": 0.25}
    records = [before, after_k2, after_mixed]
    assert claim_report.phases(records) == ["before_rl", "after_rl", "after_rl_k1-2-8"]
    lines = claim_report.table(records, "dev").splitlines()
    assert [line.split(" | ")[1] for line in lines[2:]] == ["before_rl", "after_rl", "after_rl_k1-2-8"]
    assert "| 0.25 |" in lines[-1] and "| 0.50 |" in lines[-2]


def test_an_rl_run_starts_through_the_cpu_launcher_and_composes(tmp_path, tokenizer, retriever_server, bm25_index_dir):
    """An RL run is `recipes/cpu/composed_doors.sh` (`train_on_cpu`, through recipes/common/launch.sh), as every
    CPU run: printed in dry-run mode, it composes to one agent's RL seed from its warm start on CPU at one rank."""
    from verl_memagent.cpu.topology import Topology

    write_door_sets(tmp_path / "build" / "task", tokenizer, REPO / "data" / "corpus.jsonl")
    sweep = Sweep(tmp_path, tmp_path / "r.json", rl_overrides=TINY_STEP, starts=SHIPPED_STARTS)
    sweep.retriever = retriever_server(bm25_index_dir)
    out = tmp_path / "rl" / "mem1_seed3"
    command, env = sweep.rl_launch("mem1", 3, out)
    assert command[:2] == ["bash", str(REPO / "recipes" / "cpu" / "composed_doors.sh")]
    launch = dry_run(command[1], env, command[2:])
    assert launch.recipe_yaml == REPO / "recipes" / "cpu" / "composed_doors.yaml"
    config = compose(launch)
    assert config.actor_rollout_ref.model.path == str(SHIPPED_STARTS / "mem1")
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path == str(AGENT_LOOPS)
    assert (config.data.train_files, config.data.val_files) == (str(out / "train.parquet"), str(out / "test.parquet"))
    assert (out / "train.parquet").read_bytes() == sweep.rl_data("mem1", 3).read_bytes()  # the RL questions
    assert config.data.seed == config.actor_rollout_ref.rollout.seed == 3
    assert config.trainer.default_local_dir == str(out / "checkpoints") and config.trainer.total_training_steps == 1
    assert (config.trainer.device, config.trainer.n_gpus_per_node, config.trainer.nnodes) == ("cpu", 1, 1)
    assert dict(config.ray_kwargs.ray_init) == {**config.ray_kwargs.ray_init, **Topology(1).local_ray()}


def test_the_papers_regime_launches_its_recipe_validated_on_the_dev_split(
    tmp_path, tokenizer, retriever_server, bm25_index_dir
):
    """`--regime fresh`: the run composes composed_doors_fresh.yaml (one update a step over the batch, a warm-up,
    validation every few steps), trains on fresh rl_pool questions and validates on the dev split's; an
    agent-loop setting (`--rl-agent-setting`) reaches the RL run's loops only, in a copy beside the run."""
    import pandas as pd

    write_door_sets(tmp_path / "build" / "task", tokenizer, REPO / "data" / "corpus.jsonl")
    sweep = Sweep(
        tmp_path,
        tmp_path / "r.json",
        regime="fresh",
        settings="lr3e-5",
        starts=SHIPPED_STARTS,
        rl_overrides=("actor_rollout_ref.actor.optim.lr=3e-5",),
        rl_agent_settings=("mem1.max_turns=6",),
    )
    sweep.retriever = retriever_server(bm25_index_dir)
    out = tmp_path / "rl" / "mem1_fresh_seed1"
    command, env = sweep.rl_launch("mem1", 1, out)
    launch = dry_run(command[1], env, command[2:])
    assert launch.recipe_yaml == REPO / "recipes" / "cpu" / "composed_doors_fresh.yaml"
    config = compose(launch)
    actor = config.actor_rollout_ref.actor
    assert actor.ppo_mini_batch_size == config.data.train_batch_size and actor.optim.lr == 3e-5
    assert actor.optim.lr_warmup_steps_ratio > 0 and actor.use_kl_loss and config.trainer.test_freq > 0
    assert (out / "test.parquet").read_bytes() == sweep.val_data("mem1").read_bytes()
    validation = pd.read_parquet(out / "test.parquet")
    assert set(validation.data_source) == {f"{name}_k{k}" for name in ("dev", "unseen") for k in (1, 2, 4, 8)}
    assert sweep.phase("after_rl") == "after_rl_fresh_lr3e-5"
    loops, composed = (
        {entry["name"]: entry for entry in OmegaConf.to_container(OmegaConf.load(path))}
        for path in (config.actor_rollout_ref.rollout.agent.agent_loop_config_path, AGENT_LOOPS)
    )
    assert loops["mem1"]["max_turns"] == 6 and composed["mem1"]["max_turns"] == 10  # the run's copy, not the file
    assert {**loops["mem1"], "max_turns": 10} == composed["mem1"] and loops["react"] == composed["react"]
    sweep.rl_agent_settings = ("mem1=6",)
    with pytest.raises(ValueError, match="'mem1=6' is not `agent.setting=value`"):
        sweep.rl_launch("mem1", 1, out)


def test_every_file_a_sweep_writes_keeps_the_splits_apart(tmp_path, tokenizer):
    """At the task's real sizes: the test split's doors are in its own files only, the dev split's in its own
    and the validation's, the RL questions' in the rl_pool; no RL door is asked twice in a run."""
    import pandas as pd

    sets = write_door_sets(tmp_path / "build" / "task", tokenizer, REPO / "data" / "corpus.jsonl")
    sweep = Sweep(tmp_path, tmp_path / "r.json", regime="fresh", test=True)
    sweep.write_data(tmp_path / "build" / "data")
    door_of = {
        door.question.rstrip("?"): name
        for name in ("demos", "rl", "dev", "unseen", "rl_pool", "test")
        for door in sets.of(name)
    }

    def sets_asked(path: Path) -> list[str]:
        questions = [
            q for row in pd.read_parquet(path).extra_info for q in row["question"].split(": ", 1)[1].split("; ")
        ]
        return [door_of[q.rstrip("?")] for q in questions]

    for path in (tmp_path / "build" / "data").glob("*.parquet"):
        assert set(sets_asked(path)) == {path.stem.split("_k")[0]}, path.name
    assert set(sets_asked(sweep.val_data("mem1"))) == {"dev", "unseen"}
    for seed in (0, 1):
        rl = pd.read_parquet(sweep.rl_data("mem1", seed))
        asked = [door for info in rl.extra_info for door in info["id"].split("+")]
        assert set(sets_asked(sweep.rl_data("mem1", seed))) == {"rl_pool"} and len(asked) == len(set(asked))
        assert len(asked) > len(sets.rl_pool) - 8  # the pool is dealt whole
