"""The two launches of tests/cpu/test_zero_staleness_cpu.py, composed as the recipe script composes them (dry
run), differ in the trainer's mode and its warm-up batches only, so that the test comparing their updates
compares the trainers; both generate one request at a time with no prefix cache, each call seeded. A misspelt
override costs a second here, where there it costs two vLLM-CPU launches."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from omegaconf import OmegaConf
from test_zero_staleness_cpu import AGENT, MODES, mode_overrides

from memagent_examples.composed_doors.task import write_door_sets
from memagent_examples.composed_doors.warm_start import SHIPPED_STARTS
from memagent_examples.papers_claim.sweep import REPO, Sweep
from verl_memagent.algo.trainer import check_rollout_backend
from verl_memagent.recipe_check import compose, dry_run, flat


def test_the_async_run_is_the_sync_run_but_for_its_trainer(tmp_path: Path, tokenizer):
    write_door_sets(tmp_path / "build" / "task", tokenizer, REPO / "data" / "corpus.jsonl")
    sweep = Sweep(tmp_path, tmp_path / "r.json", starts=SHIPPED_STARTS, rl_agent_settings=(f"{AGENT}.sampling_seed=0",))
    sweep.retriever = SimpleNamespace(url="http://127.0.0.1:9")  # never called by a dry run
    configs = {}
    for mode in MODES:
        command, env = sweep.rl_launch(AGENT, 0, tmp_path / mode, mode_overrides(mode))
        configs[mode] = compose(dry_run(command[1], env, command[2:]))
    colocated = configs["memagent_colocate_async"]
    # as written, each launch's own run folder named alike
    one, other = (
        {key: str(value).replace(str(tmp_path / mode), "RUN") for key, value in flat(config, resolve=False).items()}
        for mode, config in configs.items()
    )
    differing = {key for key in one.keys() | other.keys() if one.get(key) != other.get(key)}
    assert differing == {"trainer.v1.trainer_mode", "trainer.v1.colocate_async.num_warmup_batches"}
    check_rollout_backend(colocated, "colocate_async")  # the async trainers refuse the hf backend
    assert colocated.trainer.v1.colocate_async.num_warmup_batches == 0
    # verl then samples the whole batch in one local step (v1/trainer_base.py:130: parameter_sync_step 1)
    assert "parameter_sync_step" not in colocated.trainer.v1.colocate_async
    for config in configs.values():
        rollout = config.actor_rollout_ref.rollout
        assert (rollout.name, rollout.max_num_seqs, rollout.enable_prefix_caching) == ("vllm", 1, False)
        loops = OmegaConf.load(rollout.agent.agent_loop_config_path)
        assert {entry.name: entry.get("sampling_seed") for entry in loops}[AGENT] == 0
